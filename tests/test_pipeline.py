"""The pipeline under DVC: every stage runs once, nothing re-runs without cause, and a
changed param re-runs exactly the stages that read it."""

import json

import pytest
import yaml

from conftest import sh, stages_run

ALL_STAGES = {"base_model", "dataset", "convert_in", "fit_check", "train", "convert_out"}


def set_param(root, dotted: str, value) -> None:
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    node = params
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.mark.slow
def test_repro_runs_every_stage_once_then_nothing(tiny_run):
    assert set(stages_run(tiny_run.output)) == ALL_STAGES
    assert len(stages_run(tiny_run.output)) == len(ALL_STAGES)
    again = sh(["dvc", "repro"], tiny_run.path)
    assert stages_run(again.stdout) == []
    assert "Data and pipelines are up to date" in again.stdout
    assert json.loads(sh(["dvc", "status", "--json"], tiny_run.path).stdout) == {}


@pytest.mark.slow
def test_train_param_change_reruns_train_and_convert_out_only(clone_of_tiny_run):
    set_param(clone_of_tiny_run, "train.learning_rate", 5.0e-4)
    proc = sh(["dvc", "repro"], clone_of_tiny_run)
    assert stages_run(proc.stdout) == ["train", "convert_out"]
    for skipped in ("base_model", "dataset", "convert_in"):
        assert f"Stage '{skipped}' didn't change, skipping" in proc.stdout


@pytest.mark.slow
def test_convert_out_param_change_reruns_convert_out_only(clone_of_tiny_run):
    shards_before = len(list((clone_of_tiny_run / "models" / "sft-hf").glob("*.safetensors")))
    set_param(clone_of_tiny_run, "convert_out.shard_size_mb", 1)
    proc = sh(["dvc", "repro"], clone_of_tiny_run)
    assert stages_run(proc.stdout) == ["convert_out"]
    shards_after = len(list((clone_of_tiny_run / "models" / "sft-hf").glob("*.safetensors")))
    assert shards_after > shards_before


def test_every_stage_declares_only_params_that_exist(workspace):
    """A typo in dvc.yaml's params lists would silently track nothing."""
    from stages.lib.params import SCHEMA

    dvc = yaml.safe_load((workspace("declared").joinpath("dvc.yaml")).read_text())
    for name, stage in dvc["stages"].items():
        for dotted in stage["params"]:
            node = SCHEMA
            for key in dotted.split("."):
                assert key in node, f"stage {name} declares unknown param {dotted}"
                node = node[key]
            assert not dotted.startswith("runtime"), f"stage {name} declares runtime.* (never tracked)"
