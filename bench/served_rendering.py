"""What training as served is worth on the real model: the small-chat recipe trained twice, the
same steps on the same conversations, once rendered as the chat template serves them
(`train.chat_rendering: whole`) and once as MaxText 0.2.5 renders them (`per_round`: each
round through the template on its own), then both scored on the held-out conversations
rendered as served (the evaluate stage does that whatever training rendered).

    python -m bench.served_rendering                 # ~35 minutes: 40 steps each
    python -m bench.served_rendering --steps 120     # the recipe's steps (~75 minutes)

A fresh copy of the project (bench/common.py's new_workspace) switched to small-chat; the two
variants are DVC experiments of it (`dvc exp run -S ... evaluate`), so the stages before
token_lengths run once. Prints both held-out losses beside the base's, and the trained tokens
each rendering fed. Not part of bench/run.py's table: it takes longer than that whole suite.
"""

import argparse
import json
import tempfile
from pathlib import Path

from bench.common import new_workspace, timed
from testkit.workspace import sh

RENDERINGS = ("whole", "per_round")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-served-") as work:
        root = new_workspace(args.keep or Path(work) / "run", "small-chat")
        found = {}
        for rendering in RENDERINGS:
            run = timed(
                ["dvc", "exp", "run", "-n", rendering.replace("_", "-"), "-S", f"train.steps={args.steps}"]
                + ["-S", f"train.chat_rendering={rendering}", "evaluate"],
                root,
            )
            found[rendering] = {
                "seconds": run.seconds,
                "eval": json.loads((root / "metrics" / "eval.json").read_text())["eval"],
                "run": json.loads((root / "dvclive" / "metrics.json").read_text()).get("run", {}),
            }
            print(f"{rendering}: {run.seconds:.0f} s", flush=True)
        sh(["dvc", "exp", "show", "--only-changed", "--no-pager"], root, check=False)
        base = found["whole"]["eval"]["base_loss"]
        print(f"small-chat, {args.steps} steps; held-out loss of the 40 held-out conversations, as served")
        print("| training rendered | held-out loss | vs base | trained tokens in its rows | time |")
        print("|---|---|---|---|---|")
        print(f"| (base) | {base:.4f} | | | |")
        for rendering, f in found.items():
            e = f["eval"]
            print(
                f"| {rendering} | {e['fine_tuned_loss']:.4f} | {e['fine_tuned_loss'] - base:+.4f} "
                f"| {f['run'].get('trained_tokens', '?')} | {f['seconds']:.0f} s |"
            )


if __name__ == "__main__":
    main()
