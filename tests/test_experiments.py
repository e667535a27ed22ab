"""Experiments: variants run with `dvc exp run -S`, compared in `dvc exp show`, retrieved
with `dvc exp apply`; a queued grid; a LoRA variant; the evaluation that tells them apart."""

import json
import time

import pytest
import yaml

from conftest import EXPERIMENTS, apply, clone_workspace, sh, sha256s, stages_run

pytestmark = pytest.mark.slow


def exp_rows(root) -> dict:
    """`dvc exp show --json` as {experiment name: {"params": ..., "metrics": ...}}."""
    rows = {}
    for commit in json.loads(sh(["dvc", "exp", "show", "--json"], root).stdout):
        for exp in commit.get("experiments") or []:
            for rev in exp["revs"]:
                data = rev.get("data") or {}
                rows[rev.get("name") or exp.get("name")] = {
                    "params": {k: v["data"] for k, v in (data.get("params") or {}).items()},
                    "metrics": {k: v["data"] for k, v in (data.get("metrics") or {}).items()},
                }
    return rows




def test_a_train_param_reruns_train_and_what_follows(experiments):
    _, outputs, _ = experiments
    for name in EXPERIMENTS:
        assert stages_run(outputs[name]) == ["train", "convert_out", "evaluate"], name


def test_two_experiments_differ_in_their_param_and_metrics(experiments):
    root, _, _ = experiments
    rows = exp_rows(root)
    a, b = rows["lr5e-4"], rows["lora-lr5e-3"]
    assert a["params"]["params.yaml"]["train"]["learning_rate"] == 5e-4
    assert b["params"]["params.yaml"]["train"]["learning_rate"] == 5e-3
    for row in (a, b):
        m = row["metrics"]
        # (mfu too on a TPU; on CPU there is no peak to divide by, and DVC drops the null)
        run = m["dvclive/metrics.json"]["run"]
        assert {"final_loss", "median_tokens_per_sec_per_device", "median_step_time_s", "tflops_per_sec_per_device"} <= set(run)
        assert {"loss", "learning_rate", "grad_norm"} <= set(m["dvclive/metrics.json"]["train"])
        assert {"base_loss", "base_perplexity", "fine_tuned_loss", "fine_tuned_perplexity"} <= set(m["metrics/eval.json"]["eval"])
    assert a["metrics"]["dvclive/metrics.json"]["run"]["final_loss"] != b["metrics"]["dvclive/metrics.json"]["run"]["final_loss"]
    assert a["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"] != b["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"]


def test_applying_an_experiment_restores_its_weights(experiments):
    root, _, exports = experiments
    assert exports["lr5e-4"] != exports["lora-lr5e-3"]
    for name in ("lora-lr5e-3", "lr5e-4"):
        apply(root, name)
        assert sha256s(root / "models" / "sft-hf") == exports[name], name


def test_lora_variant_trains_exports_and_loads(experiments):
    import transformers

    root, _, exports = experiments
    apply(root, "lora-lr5e-3")
    assert (root / "models" / "sft-maxtext" / "lora").is_dir() and (root / "models" / "sft-maxtext" / "params").is_dir()
    check = json.loads((root / "metrics" / "export_check.json").read_text())["export"]
    assert check["passed"]  # the merged export reproduces MaxText's base + adapter, unmerged
    limits = yaml.safe_load((root / "params.yaml").read_text())["convert_out"]["check"]
    assert check["kl_max"] <= limits["max_kl"]
    model = transformers.AutoModelForImageTextToText.from_pretrained(root / "models" / "sft-hf")
    assert model.config.text_config.num_hidden_layers == 8
    m = json.loads((root / "metrics" / "eval.json").read_text())["eval"]
    assert m["fine_tuned_loss"] < m["base_loss"] - 1.0, m  # the adapter learned


def test_fine_tuning_lowers_held_out_loss(tiny_run):
    m = json.loads((tiny_run.path / "metrics" / "eval.json").read_text())["eval"]
    assert m["fine_tuned_loss"] < m["base_loss"] - 1.0, m  # the tiny data is learnable: a real, large effect
    assert m["fine_tuned_perplexity"] < m["base_perplexity"]
    generations = (tiny_run.path / "eval" / "generations.md").read_text()
    assert generations.count("**fine-tuned**") == 4 and "What is the capital of Peru?" in generations


def test_queued_grid_runs_and_reports_every_variant(tiny_run, tmp_path):
    root = clone_workspace(tiny_run, tmp_path)
    sh(["python", "-m", "tools.grid", "evaluate.max_new_tokens=4,8"], root)
    sh(["dvc", "queue", "start", "--jobs", "1"], root)
    deadline = time.monotonic() + 1200
    while True:
        status = sh(["dvc", "queue", "status"], root).stdout
        if not any(word in status for word in ("Queued", "Running")):
            break
        assert time.monotonic() < deadline, status
        time.sleep(5)
    assert "Failed" not in status, status
    rows = exp_rows(root)
    for tokens in (4, 8):
        row = rows[f"max-new-tokens{tokens}"]
        assert row["params"]["params.yaml"]["evaluate"]["max_new_tokens"] == tokens
        assert row["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"] > 0
