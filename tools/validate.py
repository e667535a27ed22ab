"""Checks params.yaml and the pipeline's inputs without running anything expensive.

    python -m tools.validate

The same checks every stage makes in its first second: the params schema (types, ranges,
allowed values, unknown keys), the local chat data (and preference pairs) row by row, and, where it exists, that
the base checkpoint is one MaxText can represent. Exit 0 when all is well.
"""

import argparse
import os

from stages import dataset, preference_data
from stages.lib import chat, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import families

BASE = paths.BASE_HF


def check_local(d: dict, select, what: str, skipper: str) -> None:
    """Reads every row of a local data section's splits through its stage's own check."""
    for _, split, limit in chat.splits(d):
        where, rows, selection = select(d, split)
        for _ in selection.rows(rows, limit):
            pass
        bad = f", {len(selection.skipped)} bad {skipper} will skip" if selection.skipped else ""
        print(f"{where}: {selection.kept} {what} ok{bad}")


def main() -> None:
    argparse.ArgumentParser(prog="python -m tools.validate", description=__doc__.split("\n\n")[0]).parse_args()
    params = load()
    print("params.yaml: ok")
    if params["dataset"]["source"] in ("local", "package"):
        check_local(params["dataset"], dataset.select, "conversations", "rows the dataset stage")
    pd = params["preference"]["data"]
    if params["preference"]["enabled"] and pd["source"] in ("local", "package"):
        check_local(pd, preference_data.select, "preference pairs", "pairs the preference_data stage")
    if os.path.exists(os.path.join(BASE, "config.json")):
        families.check_convertible(BASE, params["model"]["maxtext_name"])
        print(f"{BASE}: ok")


if __name__ == "__main__":
    run(main, "validate")
