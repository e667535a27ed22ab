"""The tiny recipe trains exactly as recorded: its first steps' losses are the golden ones
(tests/golden.py), so a MaxText upgrade, a flag change or a changed data order that alters
training fails here by name rather than somewhere downstream."""

import pytest

import golden
from conftest import apply

pytestmark = pytest.mark.slow


def test_the_tiny_recipe_loss_is_the_golden_curve(tiny_run):
    assert golden.mismatches(golden.losses(tiny_run.path)) == []


def test_the_golden_curve_tells_a_changed_learning_rate(experiments):
    """The lr5e-4 experiment (tests/test_experiments.py) trains the same data at half the
    learning rate: from step 2 on it must fail the golden comparison."""
    root, _, _ = experiments
    apply(root, "lr5e-4")
    failing = golden.mismatches(golden.losses(root))
    assert failing and not any(f.startswith("step 1:") for f in failing), failing  # step 1 is before any update
