"""A spot VM's training continues on another VM: the working directory on gs:// (through
fake-gcs-server, real MaxText writing its checkpoints there), named by content only, so a
fresh clone in another directory that pulls the same inputs resumes it, and ends
bit-identical to a run never interrupted (docs/resume.md: "Spot and preemptible VMs")."""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_faults import flat_params, wait_for_session_to_end

from testkit.gcs_server import GcsServer, running
from testkit.gcs_server import client_env as gcs_env
from testkit.workspace import clone_workspace, commit, env, set_param, sh, stages_run, train_losses

pytestmark = pytest.mark.slow
BUCKET = "spot-tests"
INPUTS = ["models/base-hf", "data/chat", "data/lengths", "models/base-maxtext"]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    with running(tmp_path_factory.mktemp("gcs"), BUCKET) as server:
        yield server


def committed_steps(gcs: GcsServer, bucket: str = BUCKET, prefix: str = "scratch/") -> list[int]:
    names = gcs.objects(bucket, prefix)
    return sorted(
        {
            int(n.split("/checkpoints/")[1].split("/")[0])
            for n in names
            if "/checkpoints/" in n and n.endswith("/commit_success.txt")
        }
    )


def reached(gcs: GcsServer, step: int, bucket: str = BUCKET, prefix: str = "scratch/") -> bool:
    """Checkpoint `step` and its metrics are on gs://bucket/prefix. A listing that times out (the
    emulator busy serving the training's own writes on a loaded machine) is asked again: the
    caller's deadline decides, not one slow answer."""
    import urllib.error

    try:
        return step in committed_steps(gcs, bucket, prefix) and saved_metrics_reach(gcs, step, bucket, prefix)
    except (TimeoutError, urllib.error.URLError):
        return False


def saved_metrics_reach(gcs: GcsServer, step: int, bucket: str = BUCKET, prefix: str = "scratch/") -> bool:
    """The metrics lines saved beside the checkpoints include `step` (the train stage saves
    them once a checkpoint and its step's line both exist)."""
    import json
    import urllib.request

    names = [n for n in gcs.objects(bucket, prefix) if n.endswith("/metrics.jsonl")]
    for name in names:
        url = f"{gcs.url}/storage/v1/b/{bucket}/o/{urllib.request.quote(name, safe='')}?alt=media"
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            if '"learning/loss"' in line and json.loads(line)["step"] >= step:
                return True
    return False


def new_vm(origin: Path, parent: Path, gcs: GcsServer) -> Path:
    """A fresh clone: its own directory and empty DVC cache, the bucket as its remote."""
    root = parent / "workspace"
    sh(["git", "clone", "-q", str(origin), str(root)], parent)
    gcs.remote_config(root, BUCKET, "dvc")
    return root


def test_a_run_killed_on_one_vm_resumes_on_another_and_ends_bit_identical(tiny_run, gcs, tmp_path_factory):
    origin = tmp_path_factory.mktemp("origin") / "project.git"
    sh(["git", "init", "-q", "--bare", "-b", "main", str(origin)], origin.parent)

    # VM 1: the tiny run's inputs, training redone into gs:// (checkpoint_period only changes
    # when checkpoints are written, not the training: the result must be tiny_run's).
    first = clone_workspace(tiny_run, tmp_path_factory.mktemp("vm1"))
    gcs.remote_config(first, BUCKET, "dvc")
    set_param(first, "runtime.scratch_dir", f"gs://{BUCKET}/scratch")
    set_param(first, "runtime.keep_scratch", True)  # so that VM 3 below finds the final checkpoint
    set_param(first, "train.checkpoint_period", 10)
    # No profile: JAX writes traces through its own C++ GCS client, which cannot be pointed at
    # the emulator (it resolves www.googleapis.com and fails the run here; on GCS it works).
    set_param(first, "runtime.profile_steps", 0)
    # The compiled train step goes to the bucket too, so the next VM does not compile it again.
    set_param(first, "runtime.compile_cache_dir", f"gs://{BUCKET}/jax-cache")
    commit(first, "train into gs://, checkpoints every 10 steps, compile cache on gs://")
    sh(["dvc", "push", *INPUTS], first, **gcs_env(gcs))  # the inputs, before training starts
    sh(["git", "remote", "set-url", "origin", str(origin)], first)
    sh(["git", "push", "-q", "origin", "main"], first)
    run = subprocess.Popen(
        ["dvc", "repro", "train"],
        cwd=first,
        env=env(**gcs_env(gcs)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 900
    while not reached(gcs, 20):
        assert run.poll() is None, "training ended before checkpoint 20"
        assert time.monotonic() < deadline, "no checkpoint 20 on gs:// after 15 minutes"
        time.sleep(2)
    # The VM is taken back: its preemption notice is SIGTERM to everything, between two
    # checkpoints (tests/test_faults.py kills by SIGKILL, of DVC alone and of everything) ...
    os.killpg(run.pid, signal.SIGTERM)
    assert run.wait(timeout=60) != 0
    wait_for_session_to_end(run.pid)
    shutil.rmtree(first)  # ... and then it is gone, with its disk

    assert gcs.objects(BUCKET, "jax-cache/"), "VM 1 wrote no compiled program to gs://"

    # VM 2: nothing of VM 1 but the bucket and the git server. (JAX_LOG_COMPILES: JAX logs
    # each persistent-cache hit, which it otherwise does at debug level.)
    second = new_vm(origin, tmp_path_factory.mktemp("vm2"), gcs)
    proc = sh(["dvc", "repro", "--pull", "--allow-missing", "train"], second, **gcs_env(gcs), JAX_LOG_COMPILES="1")
    out = proc.stdout + proc.stderr
    assert stages_run(out) == ["train"], out[-3000:]  # every input pulled, none recomputed
    resumed_at = int(out.split("train: resuming at step ", 1)[1].split(":")[0])
    assert resumed_at >= 20, out[-3000:]
    # VM 2 reads from the bucket what VM 1 compiled. (Not its train step: from restored arrays
    # MaxText's train step is another program than from fresh ones: compiled once more on a
    # resume, and cached in turn. docs/tpu-vm.md, "Speed".)
    train_log = (second / "logs" / "train.log").read_text(errors="replace")
    hits = set(re.findall(r"Persistent compilation cache hit for '([^']+)'", train_log))
    assert "jit_create_sharded_state" in hits, f"VM 2 read nothing VM 1 compiled: {hits}"
    assert len([n for n in gcs.objects(BUCKET, "jax-cache/") if n.startswith("jax-cache/jit_train_step-")]) == 2
    resumed, uninterrupted = (
        flat_params(second / "models" / "sft-maxtext" / "params"),
        flat_params(tiny_run.path / "models" / "sft-maxtext" / "params"),
    )
    assert resumed.keys() == uninterrupted.keys()
    assert [k for k in resumed if not (resumed[k] == uninterrupted[k]).all()] == []
    # The loss curve continues the killed run's, saved beside its checkpoints: no gap, no
    # step twice, each the uninterrupted run's loss.
    assert train_losses(second) == train_losses(tiny_run.path)

    # VM 3: the final checkpoint is on gs:// and nothing is local: published, not retrained.
    third = new_vm(origin, tmp_path_factory.mktemp("vm3"), gcs)
    proc = sh(["dvc", "repro", "--pull", "--allow-missing", "train"], third, **gcs_env(gcs))
    out = proc.stdout + proc.stderr
    assert "the final checkpoint (step 40) is already there; publishing it" in out, out[-3000:]
    assert "running maxtext.trainers.post_train.sft.train_sft" not in out
    published = flat_params(third / "models" / "sft-maxtext" / "params")
    assert [k for k in published if not (published[k] == uninterrupted[k]).all()] == []
    assert train_losses(third) == train_losses(tiny_run.path)
