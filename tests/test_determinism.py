"""Two runs of the tiny recipe from scratch produce the same training and the same export."""

import csv

import pytest
import yaml

from conftest import run_pipeline


def losses(root) -> list[str]:
    with open(root / "plots" / "train.csv") as f:
        return [row["loss"] for row in csv.DictReader(f)]  # the other columns are timings


def output_hashes(root) -> dict:
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}


@pytest.mark.slow
def test_two_runs_from_scratch_agree(tiny_run, workspace):
    second = run_pipeline(workspace("second-run"))
    assert losses(second.path)[0] == losses(tiny_run.path)[0]  # step 1
    assert losses(second.path) == losses(tiny_run.path)  # and every step after it
    first, again = output_hashes(tiny_run.path), output_hashes(second.path)
    for path in ("models/base-hf", "data/chat", "models/sft-hf"):
        assert first[path] == again[path], f"{path} differs between two runs from scratch"
