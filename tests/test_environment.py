"""The dependency sets stay consistent: what the TPU set shares with the CPU lock is pinned
to the same versions, and the recipes the README names exist and validate."""

import re
from pathlib import Path

from stages.lib.params import load

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", path.read_text(), flags=re.M))


def test_shared_pins_match_the_cpu_lock():
    lock, shared = pins(ROOT / "requirements" / "cpu.lock"), pins(ROOT / "requirements" / "shared-pins.txt")
    assert {"maxtext", "jax", "jaxlib", "google-tunix", "transformers", "torch", "dvc", "libtpu"} <= set(shared)
    assert {name: lock.get(name) for name in shared} == shared


def test_every_recipe_validates(monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes name their data relative to the project root
    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    assert {r.stem for r in recipes} >= {"tiny", "gemma3-4b-v6e-8"}
    for recipe in recipes:
        load(str(recipe))


def test_committed_params_is_the_tpu_recipe():
    assert (ROOT / "params.yaml").read_text() == (ROOT / "recipes" / "gemma3-4b-v6e-8.yaml").read_text()
