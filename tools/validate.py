"""Checks params.yaml and the pipeline's inputs without running anything expensive.

    python -m tools.validate

The same checks every stage makes in its first second: the params schema (types, ranges,
allowed values, unknown keys), the local chat data row by row, and, where it exists, that
the base checkpoint is one MaxText can represent. Exit 0 when all is well.
"""

import os

from stages import dataset
from stages.lib import families, paths
from stages.lib.cli import run
from stages.lib.params import load

BASE = paths.BASE_HF


def main() -> None:
    params = load()
    print("params.yaml: ok")
    d = params["dataset"]
    if d["source"] == "local":
        for _, split, limit in dataset.splits(d):
            where, rows, selection = dataset.select(d, split)
            for _ in selection.rows(rows, limit):
                pass
            bad = f", {len(selection.skipped)} bad rows the dataset stage will skip" if selection.skipped else ""
            print(f"{where}: {selection.kept} conversations ok{bad}")
    if os.path.exists(os.path.join(BASE, "config.json")):
        families.check_convertible(BASE, params["model"]["maxtext_name"])
        print(f"{BASE}: ok")


if __name__ == "__main__":
    run(main, "validate")
