"""On worker 0 of a multi-host TPU slice, the stages that run MaxText as one process (the
conversions with their gates, evaluate) must not join the slice's distributed job: MaxText,
left to its defaults, calls jax.distributed.initialize() and waits for workers that never
start. Here they run with the environment that makes MaxText form a multi-process job (the
variables our own multi-process jobs and XPK's CPU workloads set), on a slice recipe, and
finish, having skipped the distributed system."""

import json
import sys

import pytest

from testkit.workspace import set_param, sh

SLICE = {
    "hardware.kind": "v6e-16",
    "hardware.hosts": 4,
    "hardware.tpu_env": None,
    "runtime.check_hardware": False,  # no TPU here: the stages' pre-flight would stop them
    "runtime.scratch_dir": "gs://bucket/scratch",
    "runtime.launcher": "slice",
    "runtime.slice.name": "sft-slice",
    "runtime.slice.zone": "us-east5-b",
    "runtime.slice.project": "project",
}
# What tells a MaxText process that it is process 0 of a job of 4 (stages/lib/launch.py sets
# these for a CPU job, XPK for CPU workloads), and a TPU worker's identity.
WORKER_0 = {
    "JAX_COORDINATOR_ADDRESS": "localhost",
    "JOB_INDEX": "0",
    "JOB_COMPLETION_INDEX": "0",
    "PROCESSES_IN_JOB": "4",
    "JAX_PROCESS_COUNT": "4",
    "TPU_WORKER_ID": "0",
    "TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3",
}
SKIPPED = "Skipping jax distributed system due to skip_jax_distributed_system=True flag."


@pytest.mark.slow
def test_worker_0_runs_the_one_process_stages_without_joining_the_slice(clone_of_tiny_run):
    root = clone_of_tiny_run
    for key, value in SLICE.items():
        set_param(root, key, value)
    # (The other one-process stages are placed by the same code, flags.one_host, each one's
    # flags checked in tests/test_flags.py and convert_in's by MaxText in tests/test_tpu_recipe.py's
    # slice validation: convert_out, its export and its gate, runs here for them all, for the
    # suite's time.) A wait for the other workers would be 300 s (MaxText's initialization timeout).
    sh([sys.executable, "-m", "stages.convert_out"], root, timeout=600, **WORKER_0)
    command = (root / "logs" / "convert_out.log").read_text().splitlines()[0]  # the log opens with it
    assert "hardware=cpu" in command and "skip_jax_distributed_system=true" in command, command
    assert SKIPPED in (root / "logs" / "convert_out.log").read_text()  # MaxText's own entry point says so
    assert json.loads((root / "metrics" / "export_check.json").read_text())["export"]["passed"]
