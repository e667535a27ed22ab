"""On a TPU chip: what only the chip can prove (the `tpu` marker). Skipped where there is no
chip (CI, these CPU machines); on a TPU VM with the offline bundle or setup-tpu.sh's .venv:

    .venv/bin/python -m pytest --noconftest -m tpu tests/test_tpu.py

(--noconftest: the suite's fixtures start the GCS emulator and need packages the TPU set
leaves out; these tests use none of them.) Each test runs its JAX work in a child process, as
the stages do: this process never loads JAX, since one program at a time can hold the chip.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from stages.lib import hardware

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(hardware.tpu_chips_present() == 0, reason="no TPU chip on this machine"),
]
V5E = "v5litepod-1"


def on_the_chip(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """A child process with the chip (JAX_PLATFORMS as the machine has it, not conftest's cpu)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, **kwargs)


def test_the_chip_is_what_the_v5e_recipe_says():
    """hardware.kind v5litepod-1's figures (HBM a program may use) are the chip's, and the
    train stage's presence check passes here."""
    hardware.check_present({"hardware": {"kind": V5E}, "runtime": {"check_hardware": True, "launcher": "local"}})
    done = on_the_chip(
        "-c",
        "import jax, json; d = jax.devices(); "
        "print(json.dumps({'platform': d[0].platform, 'kind': d[0].device_kind, 'n': len(d), "
        "'limit': d[0].memory_stats()['bytes_limit']}))",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["platform"] == "tpu" and "v5" in seen["kind"].lower(), seen
    assert seen["n"] >= hardware.TPUS[V5E].chips
    assert abs(seen["limit"] / 2**30 - hardware.TPUS[V5E].hbm_gib_per_chip) < 0.05, seen


def test_maxtext_trains_on_the_chip_through_the_stages_entry(tmp_path):
    """MaxText's train step compiled and run on the chip through stages/in_maxtext/main.py (the
    seam every stage uses), from this environment's packages: a tiny Gemma 3, synthetic data,
    five steps; its losses finite and falling, and the peak device memory reported."""
    metrics = tmp_path / "metrics.jsonl"
    package = importlib.util.find_spec("maxtext").submodule_search_locations[0]  # not imported: no JAX here
    config = os.path.join(package, "configs", "base.yml")
    done = on_the_chip(
        "-m",
        "stages.in_maxtext.main",
        "maxtext.trainers.pre_train.train",
        "--setup",
        json.dumps({"model_name": "gemma3-4b", "hf_config": None, "hf_layout": "transformers", "served_chat": False}),
        "--",
        config,
        "model_name=gemma3-4b",
        "override_model_config=true",
        "base_emb_dim=256",
        "base_mlp_dim=512",
        "base_num_decoder_layers=6",
        "base_num_query_heads=4",
        "base_num_kv_heads=1",
        "head_dim=64",
        "vocab_size=4096",
        "dataset_type=synthetic",
        "steps=5",
        "per_device_batch_size=4",
        "max_target_length=256",
        "learning_rate=1e-3",
        "enable_checkpointing=false",
        "skip_jax_distributed_system=true",
        f"base_output_directory={tmp_path}",
        "run_name=tpu",
        f"metrics_file={metrics}",
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    losses = [s["learning/loss"] for s in steps]
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    peak = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("peak device memory:")]
    assert peak, (done.stdout + done.stderr)[-2000:]
