"""Experiments: a grid queued with tools/grid.py (`dvc exp run --queue -S` for each variant)
and run by `dvc queue start`, compared in `dvc exp show`, retrieved with `dvc exp apply`; a
LoRA variant; the evaluation that tells them apart. (`dvc exp run` in the workspace: the
convert_out.* experiment of tests/test_remote.py.)"""

import json

import pytest
import yaml

from testkit.workspace import EXPERIMENTS, apply, sh, sha256s, stages_run

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


def test_the_grid_queues_runs_and_reports_every_variant(experiments):
    assert [
        line.split()[2] for line in experiments.queued.splitlines() if line.startswith("grid: queued ")
    ] == EXPERIMENTS
    assert "Failed" not in experiments.status and experiments.status.count("Success") == len(EXPERIMENTS), (
        experiments.status
    )
    rows = exp_rows(experiments.root)
    for name, lora in zip(EXPERIMENTS, (True, False), strict=True):
        train = rows[name]["params"]["params.yaml"]["train"]
        assert train["learning_rate"] == 5e-3 and train["lora"]["enabled"] is lora, (name, train)
        assert rows[name]["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"] > 0


def test_a_train_param_reruns_train_and_what_follows(experiments):
    # (preference, off, runs too: its input, the SFT model, changed; it writes its same note.)
    for name in EXPERIMENTS:
        ran = sorted(stages_run(experiments.logs[name]))
        assert ran == ["benchmark", "convert_out", "evaluate", "preference", "train"], (
            name,
            experiments.logs[name][-2000:],
        )


def test_two_experiments_differ_in_their_param_and_metrics(experiments):
    rows = exp_rows(experiments.root)
    a, b = rows["no-lora-lr5e-3"], rows["lora-lr5e-3"]
    assert a["params"]["params.yaml"]["train"]["lora"]["enabled"] is False
    assert b["params"]["params.yaml"]["train"]["lora"]["enabled"] is True
    for row in (a, b):
        m = row["metrics"]
        # (mfu too on a TPU; on CPU there is no peak to divide by, and DVC drops the null)
        run = m["dvclive/metrics.json"]["run"]
        assert {
            "final_loss",
            "median_tokens_per_sec_per_device",
            "median_step_time_s",
            "tflops_per_sec_per_device",
        } <= set(run)
        assert {"loss", "learning_rate", "grad_norm"} <= set(m["dvclive/metrics.json"]["train"])
        assert {"base_loss", "base_perplexity", "fine_tuned_loss", "fine_tuned_perplexity"} <= set(
            m["metrics/eval.json"]["eval"]
        )
    assert (
        a["metrics"]["dvclive/metrics.json"]["run"]["final_loss"]
        != b["metrics"]["dvclive/metrics.json"]["run"]["final_loss"]
    )
    assert (
        a["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"]
        != b["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"]
    )


def test_applying_an_experiment_restores_its_weights(experiments):
    root, exported = experiments.root, {}
    for name in [*EXPERIMENTS, EXPERIMENTS[0]]:  # and back again
        apply(root, name)
        # The workspace's outputs are the ones the experiment's dvc.lock names ...
        assert json.loads(sh(["dvc", "status", "--json"], root).stdout) == {}, name
        # ... and the same files each time it is applied.
        files = sha256s(root / "models" / "sft-hf")
        assert exported.setdefault(name, files) == files, name
    assert exported[EXPERIMENTS[0]] != exported[EXPERIMENTS[1]]


def test_lora_variant_trains_exports_and_loads(experiments):
    import transformers

    root = experiments.root
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
