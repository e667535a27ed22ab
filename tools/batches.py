"""What training sees: the rows MaxText's input pipeline makes of the chat data, decoded, with
every token training learns from marked [[like this]].

    python -m tools.batches                       # the first 3 rows of data/chat/train.jsonl
    python -m tools.batches --data my.jsonl --rows 5
    python -m tools.batches --json rows.json      # the ids and the mask, for a program

Runs MaxText's own SFT input pipeline (tokenizer, chat template, completion-only masking,
packing, max_target_length) with the recipe's flags, on this machine's CPU: the rows as its
trainer receives them, including what `train.chat_rendering` does to multi-turn
conversations (stages/shared/rendering.py). Needs models/base-hf (the tokenizer and the
architecture's flags); reads params.yaml.
"""

import argparse
import json
import os
import tempfile

from stages.lib import flags, maxtext_process, paths
from stages.lib.cli import run
from stages.lib.params import load


def marked(tokenizer, ids: list[int], trained: list[bool]) -> str:
    """The row's text with each trained run of tokens in [[...]]."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or trained[i] != trained[i - 1]:
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False)
            out.append(f"[[{text}]]" if trained[start] else text)
            start = i
    return "".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.batches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(paths.DATA, "train.jsonl"), help="a JSONL of {messages}")
    parser.add_argument("--rows", type=int, default=3, help="how many rows (default 3)")
    parser.add_argument("--json", metavar="FILE", help="write the rows' ids and trained mask here instead")
    args = parser.parse_args()
    params = load()
    with tempfile.TemporaryDirectory(prefix="batches-") as work:
        report = os.path.join(work, "rows.json")
        job = flags.batches(params, os.path.abspath(args.data), work, args.rows, report)
        maxtext_process.run("batches", job, flags.placed_on_cpu(params))
        with open(report) as f:
            rows = json.load(f)["rows"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f)
        print(f"batches: wrote {len(rows)} rows to {args.json}", flush=True)
        return
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(paths.BASE_HF)
    for i, row in enumerate(rows, start=1):
        trained = sum(row["trained"])
        print(f"--- row {i}: {len(row['ids'])} tokens, {trained} trained on ([[...]])\n{marked(tokenizer, **row)}\n")


if __name__ == "__main__":
    run(main, "batches")
