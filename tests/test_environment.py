"""The dependency sets stay consistent (what the TPU set shares with the CPU lock is pinned to
the same versions), and the committed params.yaml is the committed TPU recipe."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", path.read_text(), flags=re.M))


def test_shared_pins_match_the_cpu_lock():
    lock, shared = pins(ROOT / "requirements" / "cpu.lock"), pins(ROOT / "requirements" / "shared-pins.txt")
    assert {"maxtext", "jax", "jaxlib", "google-tunix", "transformers", "torch", "dvc", "libtpu"} <= set(shared)
    assert {name: lock.get(name) for name in shared} == shared


def committed(path: str) -> str:
    """A file as committed: the demo switches the working params.yaml to the tiny recipe."""
    proc = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else (ROOT / path).read_text()  # not a git checkout


def test_committed_params_is_the_tpu_recipe():
    assert committed("params.yaml") == committed("recipes/gemma3-4b-v6e-8.yaml")
