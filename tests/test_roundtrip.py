"""A checkpoint in the Hub's layout survives HF -> MaxText -> HF unchanged (within bf16)."""

import shutil
import sys

import numpy as np
import pytest
import safetensors.numpy

from stages.shared import families
from stages.shared.families import gemma3
from testkit.workspace import sh

pytestmark = pytest.mark.slow


def tensors(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(safetensors.numpy.load_file(f))
    return out


def test_hub_layout_checkpoint_round_trips(clone_of_tiny_run):
    root = clone_of_tiny_run
    assert families.detect_layout(str(root / "models" / "base-hf"), "gemma3-4b") == "hub"
    # Export the *converted base* instead of the trained parameters: what comes out must be the base.
    shutil.rmtree(root / "models" / "sft-maxtext" / "params")
    shutil.copytree(root / "models" / "base-maxtext" / "0" / "items", root / "models" / "sft-maxtext" / "params")
    sh([sys.executable, "-m", "stages.convert_out"], root)

    base, back = tensors(root / "models" / "base-hf"), tensors(root / "models" / "sft-hf")
    assert set(back) == set(base)
    exact = 0
    for name, b in base.items():
        b32, r32 = b.astype(np.float32), back[name].astype(np.float32)
        if np.array_equal(b32, r32):
            exact += 1
            continue
        # MaxText stores the embedding times sqrt(hidden) and norms as 1 + w, in bf16: one
        # bf16 rounding of those values is all a round trip may cost.
        ulp = np.spacing(np.abs(b32).astype(np.float32)) * 2**16  # bf16 keeps 8 of float32's 24 bits
        assert np.all(np.abs(b32 - r32) <= 2 * np.maximum(ulp, 2**-9)), name
    projections = [n for n in base if n.endswith("_proj.weight") and n.startswith(gemma3.HUB_PREFIX["language_model"])]
    assert all(np.array_equal(base[n].view(np.uint16), back[n].view(np.uint16)) for n in projections)
    assert exact >= len(base) * 0.5
