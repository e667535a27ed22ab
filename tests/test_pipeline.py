"""The pipeline under DVC: every stage runs once, nothing re-runs without cause, and a
changed param re-runs exactly the stages that read it."""

import json

import pytest
import yaml

from conftest import sh, stages_run

ALL_STAGES = {"base_model", "dataset", "convert_in", "fit_check", "train", "convert_out", "evaluate"}


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
def test_convert_out_param_change_reruns_convert_out_and_evaluate_only(clone_of_tiny_run):
    # (A train.* change re-runs train, convert_out and evaluate: test_experiments.py.)
    shards_before = len(list((clone_of_tiny_run / "models" / "sft-hf").glob("*.safetensors")))
    set_param(clone_of_tiny_run, "convert_out.shard_size_mb", 1)
    proc = sh(["dvc", "repro"], clone_of_tiny_run)
    assert stages_run(proc.stdout) == ["convert_out", "evaluate"]
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


def test_training_scratch_is_keyed_by_exactly_the_train_stage_inputs(workspace, monkeypatch):
    """A killed run resumes only when nothing train reads has changed; anything else starts fresh."""
    from stages import train
    from stages.lib.params import load

    monkeypatch.chdir(workspace("digest"))
    params = load()

    def digest(section, key, value):
        changed = {**params, section: {**params[section], key: value}}
        return train.inputs_digest(changed)

    same = train.inputs_digest(params)
    assert digest("runtime", "keep_checkpoints", 5) == same  # how to run, not what
    assert digest("convert_out", "shard_size_mb", 1) == same  # read after training
    assert digest("train", "learning_rate", 1.0) != same
    assert digest("train", "seed", 7) != same
    assert digest("model", "scan_layers", not params["model"]["scan_layers"]) != same


def test_mfu_is_maxtexts_tflops_over_the_chips_peak():
    from stages import train

    steps = [{"step": i, "learning/loss": 1.0, "perf/per_device_tflops_per_sec": t, "perf/per_device_tokens_per_sec": 1.0,
              "perf/step_time_seconds": 1.0} for i, t in ((1, 5.0), (2, 459.0), (3, 459.0))]  # step 1 compiles
    tpu = train.summarise(steps, [], {"hardware": {"kind": "v6e-8"}})
    assert tpu["mfu"] == pytest.approx(459.0 / 918)  # v6e: 918 bf16 TFLOP/s per chip
    assert train.summarise(steps, [], {"hardware": {"kind": "cpu"}})["mfu"] is None
