"""Checks params.yaml and the pipeline's inputs without running anything expensive.

    python -m stages.validate

The same checks every stage makes in its first second: the params schema (types, ranges,
allowed values, unknown keys), the local chat data row by row, and, where it exists, that
the base checkpoint is one MaxText can represent. Exit 0 when all is well.
"""

import os

from stages import dataset
from stages.lib import gemma3, paths
from stages.lib.params import load
from stages.lib.cli import run

BASE = paths.BASE_HF


def main() -> None:
    params = load()
    print("params.yaml: ok")
    d = params["dataset"]
    if d["source"] == "local":
        for split in (d["train_split"], d["eval_split"]):
            path = os.path.join(d["local_dir"], f"{split}.jsonl")
            rows = dataset.check_rows(dataset.read_local(path), d["column"], path)
            print(f"{path}: {rows} conversations ok")
    if os.path.exists(os.path.join(BASE, "config.json")):
        gemma3.detect_layout(BASE)
        gemma3.maxtext_model_args(BASE, params["model"]["maxtext_name"])
        print(f"{BASE}: ok")


if __name__ == "__main__":
    run(main, "validate")
