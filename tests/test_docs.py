"""The commands README.md and docs/ give, held to the code so that they cannot drift: every module
a `python -m` names exists, every script a line runs is there and executable, and the cheap ones
a CPU can run (`--help`, `--dry-run`, `tools.plan`, `tools.recipe`) run as written, from a fresh
copy of the project. What needs a TPU or a bucket is marked so where it is given (docs/tpu-vm.md,
docs/remote.md) and is not run here."""

import importlib.util
import re
import shlex
import subprocess
import sys

import pytest

from testkit.workspace import REPO, copy_project, with_real_4b_config

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)
INLINE = re.compile(r"`((?:python3?|\.venv/bin/python)\s+-m\s[^`]+|scripts/[\w./-]+\.sh[^`]*|bench/[\w./-]+\.sh[^`]*)`")
CHEAP = ("--help", "--dry-run", "tools.plan", "tools.recipe")


def commands() -> list[tuple[str, str]]:
    """(where, command line) of every command the docs give: fenced shell blocks' lines (less
    comments and continuations joined) and inline `python -m ...` / scripts."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.findall(text):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #", 1)[0].strip()
                if line and not line.startswith("#"):
                    found.append((doc.name, line))
        found += [(doc.name, m) for m in INLINE.findall(text)]
    return found


def invocations(line: str) -> list[list[str]]:
    """The commands of a line (split at && ; |), as argument lists; [] where the shell's quoting
    is not plain (a here-document, a $(...) substitution)."""
    out = []
    for part in re.split(r"&&|;|\|\|?", line):
        try:
            words = shlex.split(part)
        except ValueError:
            continue
        words = [w for w in words if "=" not in w or w.startswith("-")] if words and "=" in words[0] else words
        if words:
            out.append(words)
    return out


def modules_named() -> dict[str, str]:
    named = {}
    for where, line in commands():
        for words in invocations(line):
            python = words[0].rsplit("/", 1)[-1] in ("python", "python3", "python3.12")
            if python and len(words) > 2 and words[1] == "-m" and re.fullmatch(r"[\w.]+", words[2]):
                named.setdefault(words[2], f"{where}: {line}")
    return named


def test_every_module_a_doc_runs_exists():
    missing = {
        m: where
        for m, where in modules_named().items()
        if importlib.util.find_spec(m.split(".")[0]) is None or importlib.util.find_spec(m) is None
    }
    assert missing == {}, missing


def test_every_script_a_doc_runs_is_there_and_executable():
    for where, line in commands():
        for words in invocations(line):
            for word in words:
                if re.fullmatch(r"(scripts|bench)/[\w./-]+\.sh", word):
                    path = REPO / word
                    assert path.is_file(), f"{where}: {line}: {word} is not there"
                    assert path.stat().st_mode & 0o111, f"{where}: {line}: {word} is not executable"


LINK = re.compile(r"\]\(([^)\s]+)\)")
ANY_FENCE = re.compile(r"^```[\w-]*\n.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_lands_on_a_file_and_a_heading():
    """A relative link names a file that is there and, with #anchor, one of its headings: the
    docs point at each other's figures by section, and a renamed section must not strand them."""
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # (https:, mailto:)
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target}: no such file")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", ANY_FENCE.sub("", file.read_text()), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{doc.name}: {target}: no such heading in {file.name}")
    assert broken == [], "\n".join(broken)


def placeholder(words: list[str]) -> bool:
    """A command with a part to fill in (NAME, N, ..., <path>, $VAR): not runnable as written."""
    return any(re.fullmatch(r"[A-Z][A-Z_]*", w) or "..." in w or "<" in w or "$" in w for w in words)


def cheap() -> list[tuple[str, list[str]]]:
    """The cheap commands the docs give, once each, as written (python as this venv's), and
    `--help` of every tool they name."""
    seen, out = set(), []
    for where, line in commands():
        for words in invocations(line):
            if words[0] in ("python", "python3", ".venv/bin/python") and len(words) > 2 and words[1] == "-m":
                runnable = any(c in words or c == words[2] for c in CHEAP) and not placeholder(words)
                for argv in ([words[1:]] if runnable else []) + (
                    [["-m", words[2], "--help"]] if words[2].startswith("tools.") else []
                ):
                    if tuple(argv) not in seen:
                        seen.add(tuple(argv))
                        out.append((where, [sys.executable, *argv]))
    return out


@pytest.mark.slow
def test_the_cheap_commands_run_as_written_from_a_fresh_copy(tmp_path):
    """`--help` of every tool, `--dry-run` of the stages (on the committed 4B recipe: MaxText
    validates each command, no TPU needed), tools.plan and tools.recipe, in a fresh copy."""
    root = with_real_4b_config(copy_project(tmp_path / "fresh", "gemma3-4b-v6e-8"))  # the committed recipe
    committed = (root / "params.yaml").read_text()
    ran = []
    for where, argv in cheap():
        done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{where}: {' '.join(argv[1:])}\n{done.stdout[-1500:]}{done.stderr[-1500:]}"
        ran.append(" ".join(argv[1:]))
        (root / "params.yaml").write_text(committed)  # (a tools.recipe switch: each command on the committed one)
    assert any("tools.plan" in r for r in ran) and any("--dry-run" in r for r in ran), ran
