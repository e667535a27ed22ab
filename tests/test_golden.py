"""The tiny recipe trains exactly as recorded: its first steps' losses are the golden ones
(tests/golden.py), so a MaxText upgrade, a flag change or a changed data order that alters
training fails here by name rather than somewhere downstream."""

import golden
import pytest

from testkit.workspace import apply

pytestmark = pytest.mark.slow


def test_the_tiny_recipe_loss_is_the_golden_curve(tiny_run):
    assert golden.mismatches(golden.losses(tiny_run.path)) == []


def test_the_golden_curve_tells_a_changed_learning_rate(experiments):
    """The no-lora-lr5e-3 experiment (testkit/workspace.py's GRID) trains the same data, fully
    fine-tuned as the recipe, at 5x its learning rate: from step 2 on it must fail the golden
    comparison."""
    root = experiments.root
    apply(root, "no-lora-lr5e-3")
    failing = golden.mismatches(golden.losses(root))
    assert failing and not any(f.startswith("step 1:") for f in failing), failing  # step 1 is before any update
