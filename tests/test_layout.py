"""The code's layers stay as docs/layout.md draws them: no import cycle among our modules;
the stages and their code (stages/lib/) never import what runs inside MaxText's process
(stages/in_maxtext/), which imports only what both sides share (stages/shared/: the contract,
the families, ...), which imports neither; no stage imports another stage; the errors module
imports nothing of ours."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "tools", "testkit", "bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_imports() -> dict[str, set[str]]:
    """{module: the modules of ours it imports, anywhere in it (function-level imports too)}."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(our_imports()) == []


def test_the_stage_process_never_imports_what_runs_inside_maxtext():
    parent_side = {
        m: deps
        for m, deps in our_imports().items()
        if m.startswith("stages.") and not m.startswith("stages.in_maxtext")
    }
    assert parent_side, "no stage modules found"
    offenders = {m: sorted(d for d in deps if d.startswith("stages.in_maxtext")) for m, deps in parent_side.items()}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_errors_is_a_leaf():
    assert our_imports()["stages.shared.errors"] == set()


def stage_modules(graph: dict) -> set[str]:
    return {m for m in graph if m.count(".") == 1 and m.startswith("stages.") and m != "stages.shared"} - {
        "stages.lib",
        "stages.in_maxtext",
    }


def test_the_child_side_imports_only_what_both_sides_share():
    graph = our_imports()
    child = {m: deps for m, deps in graph.items() if m.startswith("stages.in_maxtext")}
    assert child, "no child modules found"
    allowed = ("stages.in_maxtext", "stages.shared")
    assert {
        m: sorted(d for d in deps if not d.startswith(allowed))
        for m, deps in child.items()
        if any(not d.startswith(allowed) for d in deps)
    } == {}


def test_what_both_sides_share_imports_neither_side():
    graph = our_imports()
    shared = {m: deps for m, deps in graph.items() if m.startswith("stages.shared")}
    assert "stages.shared.contract" in shared
    offenders = {m: sorted(d for d in deps if not d.startswith("stages.shared")) for m, deps in shared.items()}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_no_stage_imports_another_stage():
    graph = our_imports()
    stages = stage_modules(graph)
    assert {"stages.train", "stages.preference", "stages.fit_check"} <= stages
    assert {m: sorted(graph[m] & stages) for m in stages if graph[m] & stages} == {}
