"""Past one VM, proven here: the tiny recipe's training, then its preference tuning, each as a
job of two JAX processes (hardware.hosts 2), started by the stage through the same worker line a
TPU slice's workers run (stages/lib/launch.py, `bash -c` in place of gcloud's ssh), every
input and checkpoint on gs:// (fake-gcs-server). Two processes with one CPU device each must
train exactly as one process with two devices: measured bit-identical (train: 8 steps across a
killed worker and its resume; preference tuning with ORPO: 4 steps), so the comparison is exact.

The one-process reference training reaches the bucket through a flaky one (testkit/flaky_proxy.py:
429s, 503s and connections dropped before and halfway through answers), its compilation
cache on gs:// too, as a spot VM's run meets GCS under load: it must complete through the
clients' retries and end bit for bit as the two processes did on a bucket that never failed.
(A share of 4% + 2% here, for the suite's time: each retry waits a backoff. The proxy's rolls
are seeded: at these shares its first 153 requests already hold each kind of fault, and the
training's reference makes hundreds. 20% + 10% through a whole tiny run: bench/flaky_bucket.py,
docs/resume.md.)"""

import json
import time

import numpy as np
import psutil
import pytest
from test_faults import Repro, wait_for_session_to_end

from testkit.flaky_proxy import FAULTS, FlakyProxy
from testkit.gcs_server import GcsServer, running
from testkit.gcs_server import client_env as gcs_env
from testkit.workspace import clone_workspace, commit, flat_params, set_param, sh, stages_run

pytestmark = pytest.mark.slow
BUCKET = "multihost-tests"
TOKEN = "hf_multihostcanary0123456789"
SETTINGS = {
    "train.steps": 8,  # a checkpoint at 4, the kill after it, the resume to 8
    "train.checkpoint_period": 4,
    "train.eval_interval": 0,
    "train.packing": False,  # a host packs its own rows: only unpacked batches are the same rows as one process's
    "runtime.data_workers": 0,
    "runtime.profile_steps": 0,
    "runtime.keep_scratch": False,
    "runtime.scratch_dir": f"gs://{BUCKET}/scratch",
}


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    with running(tmp_path_factory.mktemp("gcs"), BUCKET) as server:
        yield server


@pytest.fixture(scope="module")
def flaky(gcs):
    """The same bucket, reached through a proxy that fails a share of requests."""
    with FlakyProxy(gcs.url, fail_share=0.04, reset_share=0.02) as proxy:
        yield proxy


# Preference tuning of that SFT model (stages/preference.py): 4 steps of one pair a device
# (one pair a device: a step's pairs are then the same pairs on the same devices either way),
# with ORPO, train_dpo's other algorithm (DPO runs in tests/test_preference.py).
PREFERENCE = {
    "preference.enabled": True,
    "preference.algorithm": "orpo",
    "preference.steps": 4,
    "preference.checkpoint_period": 4,
    "preference.per_device_batch_size": 1,
}
ONE_PROCESS_TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


@pytest.fixture(scope="module")
def workspaces(tiny_run, tmp_path_factory):
    """Clones of tiny_run training as one process with two devices (`one`, the reference) and
    as two processes (`two`), their scratch on gs://."""
    out = {}
    for name, hosts in (("one", 1), ("two", 2)):
        root = clone_workspace(tiny_run, tmp_path_factory.mktemp(f"{name}-process"))
        for key, value in {**SETTINGS, "hardware.hosts": hosts}.items():
            set_param(root, key, value)
        if name == "one":  # (through the flaky bucket: its compiled programs on gs:// too)
            set_param(root, "runtime.compile_cache_dir", f"gs://{BUCKET}/jax-cache")
        commit(root, f"train as {hosts} process(es), scratch on gs://")
        out[name] = root
    return out


def worker_process(index: int) -> psutil.Process | None:
    """MaxText's process for worker `index` of the running job (its JOB_COMPLETION_INDEX)."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "stages.in_maxtext.main" in " ".join(proc.info["cmdline"] or []) and proc.environ().get(
                "JOB_COMPLETION_INDEX"
            ) == str(index):
                return proc
        except psutil.Error:
            continue
    return None


def committed(gcs: GcsServer, step: int, stage: str = "train") -> bool:
    """Whether the checkpoint of `step` of the stage's run is complete on gs://."""
    objects = gcs.objects(BUCKET, f"scratch/{stage}-")
    return any(n.endswith(f"/checkpoints/{step}/commit_success.txt") for n in objects)


def kill_worker_1_after(gcs: GcsServer, run: Repro, stage: str, step: int) -> str:
    """Kills worker 1 of the stage's job once checkpoint `step` is on gs://; returns the output
    of the run, which must have failed within 30 s, naming the worker."""
    # (Every 0.2 s, each poll listing the bucket: steps take seconds, the next checkpoint is steps on.)
    run.wait_for(lambda: committed(gcs, step, stage) and worker_process(1), f"checkpoint {step} of the {stage} job")
    worker_process(1).kill()
    killed_at = time.monotonic()
    assert run.proc.wait(timeout=120) != 0
    failed_after = time.monotonic() - killed_at
    wait_for_session_to_end(run.proc.pid)
    out = run.output()
    assert "on 2 workers" in out and "worker 1 of 2 was killed by SIGKILL" in out, out[-3000:]
    assert "the other workers were stopped" in out and f"logs/{stage}.worker-1.log" in out
    assert failed_after < 30, f"the stage took {failed_after:.0f} s to notice the dead worker"
    assert worker_process(0) is None  # worker 0 does not wait on for its peer
    return out


def assert_same_weights(ours, reference) -> None:
    resumed, expected = flat_params(ours), flat_params(reference)
    assert resumed.keys() == expected.keys()
    differing = [k for k in resumed if not np.array_equal(resumed[k], expected[k])]
    assert differing == [], f"{len(differing)} arrays differ from the one-process run, e.g. {differing[:3]}"


def test_two_processes_train_as_one_process_with_two_devices_and_survive_a_killed_worker(workspaces, gcs, flaky):
    cloud = gcs_env(gcs)
    # The reference: one process, two CPU devices, the same global batch (2 x per-device 1),
    # through the flaky bucket.
    one, two = workspaces["one"], workspaces["two"]
    sh(["dvc", "repro", "train"], one, **gcs_env(flaky), **ONE_PROCESS_TWO_DEVICES)
    print(f"faults injected: {dict(flaky.injected)}; requests passed: {flaky.passed}")
    assert set(flaky.injected) == set(FAULTS), flaky.injected  # each kind met, and retried

    # --dry-run: each worker's exact command, validated by MaxText; no credential in any.
    dry = sh(["python", "-m", "stages.train", "--dry-run"], two, **cloud, HF_TOKEN=TOKEN)
    shown = dry.stdout + dry.stderr
    lines = [ln for ln in shown.splitlines() if ln.startswith("  worker ")]
    assert [ln.split(":")[0] for ln in lines] == ["  worker 0 of 2", "  worker 1 of 2"], shown
    assert all("bash -c" in ln and "JOB_COMPLETION_INDEX=" in ln and '"fetch": {"gs://' in ln for ln in lines), shown
    assert "MaxText accepted the configuration" in shown and TOKEN not in shown
    assert not gcs.objects(BUCKET, "scratch/"), "a dry run uploaded something"

    # The job of two processes; worker 1 is killed once checkpoint 4 is on gs://.
    out = kill_worker_1_after(gcs, Repro(two, "train", name="two-processes", **cloud), "train", 4)
    assert stages_run(out) == ["train"], out[-3000:]  # hardware.hosts re-runs train, not convert_in
    # Everything the hosts read came from gs://: the inputs were staged there, keyed by content.
    staged = gcs.objects(BUCKET, "scratch/")
    assert any("/inputs/base-maxtext-" in n and n.endswith("/items/_METADATA") for n in staged)
    assert {"host-000.jsonl", "host-001.jsonl"} <= {n.rsplit("/", 1)[-1] for n in staged if "/inputs/from-step-0/" in n}

    # Run again: the job resumes from checkpoint 4, each host's stream after the rows its steps used.
    proc = sh(["dvc", "repro", "train"], two, **cloud)
    out = proc.stdout + proc.stderr
    assert "train: resuming at step 4:" in out and "staged the base checkpoint" not in out, out[-3000:]  # uploaded once
    assert_same_weights(two / "models" / "sft-maxtext" / "params", one / "models" / "sft-maxtext" / "params")
    assert json.loads((two / "dvclive" / "metrics.json").read_text())["run"]["steps"] == 8
    assert json.loads(sh(["dvc", "status", "--json", "train"], two).stdout) == {}


def test_two_processes_preference_tune_as_one_process_with_two_devices(workspaces, gcs):
    """ORPO from the SFT model each workspace trained above, as one job of two processes, uninterrupted.
    (A worker killed and resumed is the training's, above: the same launcher, the same failure
    line and Orbax's same restore; each host's pairs after a resume: tests/test_preference.py.
    The suite's time: this test with its own kill and a reference through the flaky bucket took
    ~470 s of the suite on a 2-core machine.)"""
    cloud = gcs_env(gcs)
    one, two = workspaces["one"], workspaces["two"]
    for root in (one, two):
        for key, value in PREFERENCE.items():
            set_param(root, key, value)
        commit(root, "preference tuning on")
    sh(["dvc", "repro", "preference"], one, **cloud, **ONE_PROCESS_TWO_DEVICES)

    proc = sh(["dvc", "repro", "preference"], two, **cloud)
    out = proc.stdout + proc.stderr
    assert "preference: running" in out and "on 2 workers" in out, out[-3000:]
    assert stages_run(out)[-1] == "preference", out[-3000:]
    staged = gcs.objects(BUCKET, "scratch/")
    assert any("/inputs/sft-maxtext-" in n and n.endswith("/params/_METADATA") for n in staged)  # the SFT model
    ours, reference = (root / "models" / "preference-maxtext" / "params" for root in (two, one))
    assert_same_weights(ours, reference)
    run_summary = json.loads((two / "dvclive-preference" / "metrics.json").read_text())["run"]
    assert run_summary["steps"] == 4 and run_summary["algorithm"] == "orpo"
    assert json.loads(sh(["dvc", "status", "--json", "preference"], two).stdout) == {}
