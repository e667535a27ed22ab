"""Checks params.yaml and the pipeline's inputs without running anything expensive.

    python -m tools.validate

The same checks every stage makes in its first second: the params schema (types, ranges,
allowed values, unknown keys), the local chat data (and preference pairs) row by row, and, where it exists, that
the base checkpoint is one MaxText can represent. Exit 0 when all is well.
"""

import os

from stages import dataset, preference_data
from stages.lib import chat, families, paths
from stages.lib.cli import run
from stages.lib.params import load

BASE = paths.BASE_HF


def main() -> None:
    params = load()
    print("params.yaml: ok")
    d = params["dataset"]
    if d["source"] == "local":
        for _, split, limit in chat.splits(d):
            where, rows, selection = dataset.select(d, split)
            for _ in selection.rows(rows, limit):
                pass
            bad = f", {len(selection.skipped)} bad rows the dataset stage will skip" if selection.skipped else ""
            print(f"{where}: {selection.kept} conversations ok{bad}")
    pd = params["preference"]["data"]
    if params["preference"]["enabled"] and pd["source"] == "local":
        for _, split, limit in chat.splits(pd):
            where, rows, selection = preference_data.select(pd, split)
            for _ in selection.rows(rows, limit):
                pass
            bad = (
                f", {len(selection.skipped)} bad pairs the preference_data stage will skip" if selection.skipped else ""
            )
            print(f"{where}: {selection.kept} preference pairs ok{bad}")
    if os.path.exists(os.path.join(BASE, "config.json")):
        families.check_convertible(BASE, params["model"]["maxtext_name"])
        print(f"{BASE}: ok")


if __name__ == "__main__":
    run(main, "validate")
