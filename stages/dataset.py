"""Stage dataset: chat data for training and evaluation, validated, in data/chat/.

    python -m stages.dataset

Writes data/chat/train.jsonl and data/chat/eval.jsonl (a `messages` column in UltraChat's
format) and metrics/dataset.json (row counts). Sources, chosen by `dataset.source`:
  local - <dataset.local_dir>/<split>.jsonl files in the repo (the tiny recipe's data)
  hub   - a Hugging Face dataset loaded with `datasets` at a pinned commit
          (e.g. HuggingFaceH4/ultrachat_200k, splits train_sft / test_sft)
Every row is checked (stages/lib/chat.py) before anything is written; a bad row stops the
stage with its split and row number.
"""

import json
import os

from stages.lib import chat, hardware, hub, outputs, paths
from stages.lib.cli import UserError, run
from stages.lib.params import load

OUT = paths.DATA
METRICS = os.path.join("metrics", "dataset.json")


def read_local(path: str):
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None


def read_hub(d: dict, split: str):
    for index, row in enumerate(hub.load_dataset_split(d["repo_id"], d["revision"], split), start=1):
        yield index, row


def records(rows, column: str, where: str, limit: int | None = None):
    """Yields each row as {"messages": [...]}, stopping with the row number at the first bad one."""
    count = 0
    for row_no, row in rows:
        if limit is not None and count >= limit:
            break
        if not isinstance(row, dict) or column not in row:
            raise UserError(f"{where}, row {row_no}: no {column!r} column")
        record = {"messages": row[column]}
        bad = chat.problem(record)
        if bad:
            raise UserError(f"{where}, row {row_no}: {bad}")
        count += 1
        yield record
    if count == 0:
        raise UserError(f"{where}: no rows; an empty split cannot be trained or evaluated on")


def check_rows(rows, column: str, where: str) -> int:
    return sum(1 for _ in records(rows, column, where))


def write_split(rows, column: str, where: str, limit: int | None, out_path: str) -> int:
    count = 0
    with open(out_path, "w") as f:
        for record in records(rows, column, where, limit):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def main() -> None:
    params = load()
    hardware.check_present(params)
    d = params["dataset"]
    if d["source"] == "hub":
        hub.check_access(d["repo_id"], d["revision"], "dataset")
    counts = {}
    with outputs.staged_dir(OUT) as tmp:
        for name, split, limit in (("train", d["train_split"], d["max_train_rows"]), ("eval", d["eval_split"], d["max_eval_rows"])):
            if d["source"] == "local":
                where = os.path.join(d["local_dir"], f"{split}.jsonl")
                rows = read_local(where)
            else:
                where = f"{d['repo_id']} split {split}"
                rows = read_hub(d, split)
            counts[f"{name}_rows"] = write_split(rows, d["column"], where, limit, os.path.join(tmp, f"{name}.jsonl"))
            print(f"dataset: {name}: {counts[f'{name}_rows']} conversations from {where}", flush=True)
    outputs.write_json(METRICS, counts)


if __name__ == "__main__":
    run(main, "dataset")
