"""The tiny recipe trains exactly as recorded: its first steps' losses are the golden ones
(tests/golden.py), so a MaxText upgrade, a flag change or a changed data order that alters
training fails here by name rather than somewhere downstream."""

import golden
import pytest

from testkit.workspace import apply

pytestmark = pytest.mark.slow


def test_the_tiny_recipe_loss_is_the_golden_curve(tiny_run):
    assert golden.mismatches(golden.losses(tiny_run.path)) == []


def test_the_golden_curve_tells_a_changed_training(experiments):
    """The lora experiment (testkit/workspace.py's GRID) trains the same data at the same rate
    through a LoRA adapter instead of every weight: after its first updates it must fail the
    golden comparison (measured: from step 3), at step 1 not. (tests/test_small.py's golden
    test tells a changed learning rate.)"""
    root = experiments.root
    apply(root, "lora")
    failing = golden.mismatches(golden.losses(root))
    assert failing and not any(f.startswith("step 1:") for f in failing), failing  # step 1 is before any update
