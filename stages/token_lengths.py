"""Stage token_lengths: every conversation's length in tokens, as MaxText's SFT pipeline counts it.

    python -m stages.token_lengths

Writes data/lengths/train.npy and data/lengths/eval.npy (int32, one per row of
data/chat/<split>.jsonl, before max_target_length cuts it; stages/in_maxtext/count_tokens.py says
how they are counted) and metrics/token_lengths.json (median, 90th percentile, longest).
Computed once per dataset and tokenizer, on every core: the train stage reads them (how many
conversations max_target_length cuts) instead of tokenizing 200k conversations each time it
starts, a resume after a preemption included.
"""

import os

import numpy as np

from stages.lib import flags, hardware, maxtext, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load

METRICS = os.path.join("metrics", "token_lengths.json")
SPLITS = ("train", "eval")


def summary(lengths: np.ndarray) -> dict:
    # Keyed like metrics/dataset.json ({split: {"rows": ...}}), so `dvc metrics show` puts
    # both files' row counts in one column.
    return {
        "rows": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "median_tokens": int(np.median(lengths)),
        "p90_tokens": int(np.percentile(lengths, 90)),
        "max_tokens": int(lengths.max()),
    }


def main() -> None:
    params = load()
    hardware.check_present(params)
    with outputs.staged_dir(paths.LENGTHS) as tmp:
        splits = {os.path.join(paths.DATA, f"{split}.jsonl"): os.path.join(tmp, f"{split}.npy") for split in SPLITS}
        # Tokenising only: on the CPU, leaving the accelerator (and its runtime settings) alone.
        maxtext.run("token_lengths", flags.count_tokens(splits), flags.on_cpu(params))
        report = {split: summary(np.load(os.path.join(tmp, f"{split}.npy"))) for split in SPLITS}
    outputs.write_json(METRICS, report)
    t = report["train"]
    print(
        f"token_lengths: {t['rows']} training conversations, median {t['median_tokens']} tokens, 90% under "
        f"{t['p90_tokens']}, "
        f"longest {t['max_tokens']}; wrote {paths.LENGTHS}",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "token_lengths")
