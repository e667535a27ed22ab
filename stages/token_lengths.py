"""Stage token_lengths: every conversation's length in tokens, as MaxText's SFT pipeline counts it.

    python -m stages.token_lengths

Writes data/lengths/train.npy and data/lengths/eval.npy (int32, one per row of
data/chat/<split>.jsonl, before max_target_length cuts it), data/lengths/constraints.npy (the
same for the constraint examples, data/constraints/train.jsonl), data/lengths/<split>-turns.npz
(the tokens, and the trained tokens, of each conversation cut after each of its assistant
turns) and metrics/token_lengths.json (median, 90th percentile, longest; the tokens trained
on). Counted as training renders them (`train.chat_rendering`: as served, or MaxText's own
rounds; stages/in_maxtext/count_tokens.py). Computed once per dataset, tokenizer and
rendering, on every core: the train stage reads them (packing; what happens to conversations
longer than max_target_length, `train.long_conversations`) instead of tokenizing 200k
conversations each time it starts, a resume after a preemption included.
"""

import os

import numpy as np

from stages.lib import flags, hardware, maxtext_process, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load

METRICS = os.path.join("metrics", "token_lengths.json")
SPLITS = ("train", "eval")


def summary(lengths: np.ndarray, turns: dict) -> dict:
    # Keyed like metrics/dataset.json ({split: {"rows": ...}}), so `dvc metrics show` puts
    # both files' row counts in one column.
    last_turns = np.cumsum(turns["turns"]) - 1  # each row's whole conversation, in the flat arrays
    return {
        "rows": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "trained_tokens": int(turns["cut_trained"][last_turns].sum()),
        "median_tokens": int(np.median(lengths)),
        "p90_tokens": int(np.percentile(lengths, 90)),
        "max_tokens": int(lengths.max()),
    }


def main() -> None:
    params = load()
    hardware.check_present(params)
    with outputs.staged_dir(paths.LENGTHS) as tmp:
        splits = {os.path.join(paths.DATA, f"{split}.jsonl"): os.path.join(tmp, split) for split in SPLITS}
        splits[os.path.join(paths.CONSTRAINTS, "train.jsonl")] = os.path.join(tmp, "constraints")
        # Tokenising only: on the CPU, leaving the accelerator (and its runtime settings) alone.
        maxtext_process.run("token_lengths", flags.count_tokens(params, splits), flags.placed_on_cpu(params))
        report = {
            split: summary(np.load(os.path.join(tmp, f"{split}.npy")), np.load(os.path.join(tmp, f"{split}-turns.npz")))
            for split in SPLITS
        }
    outputs.write_json(METRICS, report)
    t = report["train"]
    print(
        f"token_lengths: {t['rows']} training conversations, median {t['median_tokens']} tokens, 90% under "
        f"{t['p90_tokens']}, longest {t['max_tokens']}; {t['trained_tokens']} of their {t['tokens']} tokens are "
        f"trained on; wrote {paths.LENGTHS}",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "token_lengths")
