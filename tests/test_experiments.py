"""Experiments: a grid of tools/grid.py run past one machine (`--on local:2`: two workers in
clones of their own, git and the GCS emulator between them, one worker's spot VM preempted
mid-training and its variant resumed by a worker on a new VM),
compared in `dvc exp show` of the user's clone, retrieved with `dvc exp apply`; a LoRA
variant; the evaluation that tells them apart. The same grid without --on is queued for
`dvc queue start`. (`dvc exp run` in the workspace: the convert_out.* experiment of
tests/test_remote.py. The grid's commands for TPU VMs and XPK: tests/test_grid_engines.py.)"""

import json
import re
import sys

import pytest
import yaml
from test_faults import output_hashes

from testkit.workspace import (
    AS_RECIPE,
    EXPERIMENTS,
    GRID,
    apply,
    flat_params,
    sh,
    sha256s,
    stages_run,
    train_losses,
)
from tools.grid import shared_stages

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


def last_attempt(log: str) -> str:
    """A variant's output from its last `dvc exp run` (a killed variant's log holds two)."""
    return log.rsplit("$ dvc exp run", 1)[-1]


def finisher(experiments, name: str) -> str:
    """The worker that finished the variant."""
    (worker,) = [w for w, log in experiments.worker_logs.items() if f"{w}: {name}: done in" in log]
    return worker


def finished_run(experiments, name: str) -> str:
    """The variant's output from the run that finished it."""
    return last_attempt(experiments.logs[name][finisher(experiments, name)])


def test_the_grid_runs_every_variant_on_two_workers_and_the_users_clone_shows_them(experiments):
    status = sh([sys.executable, "-m", "tools.grid", "status", experiments.grid_id], experiments.root).stdout
    assert status.count(" done on ") == len(EXPERIMENTS) + 1, status  # and the shared stages
    rows = exp_rows(experiments.root)
    assert set(EXPERIMENTS) <= set(rows), rows.keys()
    for name in EXPERIMENTS:
        train = rows[name]["params"]["params.yaml"]["train"]
        assert train["learning_rate"] == 1e-3 and train["lora"]["enabled"] is (name == "lora"), (name, train)
        assert rows[name]["metrics"]["metrics/eval.json"]["eval"]["fine_tuned_loss"] > 0
    # Every worker that was not preempted finished something (none sat out the grid).
    finished = {w: log for w, log in experiments.worker_logs.items() if w != experiments.preempted}
    assert all("done in" in log for log in finished.values()), experiments.said[-3000:]


def test_the_shared_stages_ran_once_in_all(experiments):
    shared = shared_stages([s.split("=")[0] for s in GRID])
    ran = [s for log in experiments.worker_logs.values() for s in stages_run(log)]
    assert sorted(s for s in ran if s in shared) == sorted(shared), ran
    for name in EXPERIMENTS:  # each variant pulled them, the new VM's too
        assert not set(stages_run("".join(experiments.logs[name].values()))) & set(shared), name


def test_a_train_param_reruns_train_and_what_follows(experiments):
    # preference, self_pairs and preference_data, off, run too: the SFT model is the first two's
    # input, self_pairs' output preference_data's, so none is a stage the variants share; each
    # writes its same note. fit_check too: the LoRA axis is one of its params (LoRA's step is
    # another program).
    after = ["benchmark", "convert_out", "evaluate", "export_gguf", "preference", "preference_data", "self_pairs"]
    for name in EXPERIMENTS:
        ran = sorted(stages_run(finished_run(experiments, name)))
        assert ran == sorted(["fit_check", "train", *after]), (name, finished_run(experiments, name)[-2000:])


def test_the_preempted_variant_resumed_on_a_new_vm_and_ended_as_run_here(experiments, tiny_run):
    """AS_RECIPE is the recipe itself: its spot VM preempted (SIGTERM to everything) after
    checkpoint 20, it resumed on another machine from what gs:// holds, the checkpoints and the
    compiled programs, and must end exactly as tiny_run (this machine, one `dvc repro`, never
    interrupted) did: the same weights, the same loss at every step, the same held-out losses
    (here training's, there evaluate's). With the shared stages from scratch, the grid is also
    a second run of the recipe from nothing: every output that is not MaxText's own checkpoint
    is the same file."""
    preempted, resumed_on = experiments.preempted, finisher(experiments, AS_RECIPE)
    assert f"grid: worker {preempted} exited 143" in experiments.said  # gone with its VM: not started again
    assert f"grid worker {preempted}: stopped" in experiments.worker_logs[preempted]
    assert "resuming at step" not in experiments.logs[AS_RECIPE][preempted]
    assert resumed_on != preempted and "train: resuming at step 20:" in finished_run(experiments, AS_RECIPE)
    # The new machine read from the bucket what the old one compiled. (Not its train step: from
    # restored arrays MaxText's train step is another program than from fresh ones. docs/tpu-vm.md, "Speed".)
    train_log = experiments.clones[resumed_on] / ".dvc" / "tmp" / "grid-logs" / AS_RECIPE / "train.log"
    hits = set(re.findall(r"Persistent compilation cache hit for '([^']+)'", train_log.read_text(errors="replace")))
    assert "jit_create_sharded_state" in hits, f"read nothing compiled before from gs://: {hits}"
    root = experiments.root
    apply(root, AS_RECIPE)
    resumed, here = (
        flat_params(root / "models" / "sft-maxtext" / "params"),
        flat_params(tiny_run.path / "models" / "sft-maxtext" / "params"),
    )
    assert resumed.keys() == here.keys() and [k for k in resumed if not (resumed[k] == here[k]).all()] == []
    assert train_losses(root) == train_losses(tiny_run.path)
    grid_run, local_run = (json.loads((r / "dvclive" / "metrics.json").read_text()) for r in (root, tiny_run.path))
    assert grid_run["run"]["final_loss"] == local_run["run"]["final_loss"]  # (the speed of a run is not its result)
    # The held-out curve continued across the preemption: each evaluation once (the resumed
    # run's own at its first step, 20, is not one of the curve's).
    evals = (root / "dvclive" / "plots" / "metrics" / "eval" / "loss.tsv").read_text().splitlines()[1:]
    assert [int(line.split("\t")[0]) for line in evals] == [0, 40], evals
    # evaluate took the held-out losses training computed at steps 0 and 40 and started no
    # MaxText process; they are what tiny_run's evaluate computed on the same weights (tiny_run:
    # no in-training evaluation): one quantity, either way.
    finished = finished_run(experiments, AS_RECIPE)
    assert "(computed by training)" in finished and "running stages.in_maxtext.heldout" not in finished, finished
    reused, computed = (json.loads((r / "metrics" / "eval.json").read_text())["eval"] for r in (root, tiny_run.path))
    assert (reused["loss_from"], computed["loss_from"]) == ("training", "evaluate")
    for key in ("base_loss", "fine_tuned_loss", "base_perplexity", "fine_tuned_perplexity"):
        assert reused[key] == pytest.approx(computed[key], rel=1e-5), key
    assert reused["target_tokens"] == computed["target_tokens"]
    grid_run, local_run = (output_hashes(r) for r in (root, tiny_run.path))
    for path in ("models/base-hf", "data/chat", "data/lengths", "models/sft-hf"):
        assert grid_run[path] == local_run[path], f"{path} differs between two runs from scratch"


def test_a_finished_variant_is_published_not_trained_again_on_another_vm(experiments, tiny_run, tmp_path):
    """A machine that finds the variant's final checkpoint on gs:// (as after a worker that
    trained to the end and was lost before it pushed) publishes it: no training."""
    vm, cloud = tmp_path / "vm-3", experiments.cloud
    sh(["git", "clone", "-q", str(experiments.origin), str(vm)], tmp_path)
    experiments.server.remote_config(vm, "grid", "dvc")
    sh(["dvc", "exp", "pull", "origin", AS_RECIPE, "--no-cache"], vm, **cloud)
    sh(["dvc", "exp", "branch", AS_RECIPE, "vm-3"], vm, **cloud)
    sh(["git", "checkout", "-q", "vm-3"], vm)
    inputs = ["base_model", "dataset", "constraints", "token_lengths", "convert_in"]
    sh(["dvc", "pull", *inputs], vm, **cloud)
    # --force: the train stage runs although the remote holds its outputs, as if they had never been pushed.
    proc = sh(["dvc", "repro", "--single-item", "--force", "train"], vm, **cloud)
    out = proc.stdout + proc.stderr
    assert "the final checkpoint (step 40) is already there; publishing it" in out, out[-3000:]
    assert "running maxtext.trainers.post_train.sft.train_sft" not in out
    published, here = (flat_params(r / "models" / "sft-maxtext" / "params") for r in (vm, tiny_run.path))
    assert [k for k in published if not (published[k] == here[k]).all()] == []
    assert train_losses(vm) == train_losses(tiny_run.path)


def test_two_experiments_differ_in_their_param_and_metrics(experiments):
    rows = exp_rows(experiments.root)
    a, b = rows["no-lora"], rows["lora"]
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
    assert len({json.dumps(files) for files in exported.values()}) == len(EXPERIMENTS)


def test_lora_variant_trains_exports_and_loads(experiments):
    import transformers

    root = experiments.root
    apply(root, "lora")
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


def test_without_workers_the_grid_is_queued_for_dvc_queue(workspace):
    root = workspace("queue")
    said = sh([sys.executable, "-m", "tools.grid", *GRID], root).stdout
    assert [line.split()[2] for line in said.splitlines() if line.startswith("grid: queued ")] == EXPERIMENTS
    status = sh(["dvc", "queue", "status"], root).stdout
    assert all(re.search(rf"{name}\s.*Queued", status) for name in EXPERIMENTS), status
    assert yaml.safe_load((root / "params.yaml").read_text())["train"]["learning_rate"] == 1e-3  # untouched
