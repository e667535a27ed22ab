"""The export check's arithmetic (stages/in_maxtext/logit_check.py): how logits are compared and
when a comparison fails convert_out.check's limits. (The check on real exports, and the
faults it catches, are in tests/test_export.py.)"""

import numpy as np
import pytest

from stages.lib import gates
from stages.shared import logits as figures

LIMITS = {"max_kl": 2.5e-4, "max_mean_kl": 6e-5, "min_top1_agreement": 0.99, "tie_margin": 0.05}


def logits(seed: int, positions: int = 6, vocab: int = 50) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, (positions, vocab)).astype(np.float32)


def test_identical_logits_agree_exactly():
    ref = logits(0)
    r = figures.compare(ref, ref.copy(), tie_margin=0.0)
    assert r["kl_max"] == pytest.approx(0, abs=1e-12) and r["top1_agreement"] == 1.0 and r["max_abs_logit_diff"] == 0
    assert r["tokens"] == 6
    assert gates.logit.threshold_failures(r, LIMITS) == []


def test_kl_is_of_the_reference_from_the_candidate():
    ref, cand = logits(0), logits(0)
    cand[2] += np.linspace(0, 1, cand.shape[1])  # one position skewed
    r = figures.compare(ref, cand, tie_margin=0.0)
    p = np.exp(figures.log_softmax(ref[2]))
    expected = float(np.sum(p * (figures.log_softmax(ref[2]) - figures.log_softmax(cand[2]))))
    assert r["kl_max"] == pytest.approx(expected, rel=1e-9)
    assert r["kl_mean"] == pytest.approx(expected / 6, rel=1e-9)


def test_a_near_tie_is_not_a_disagreement_but_a_real_flip_is():
    ref = np.zeros((2, 4), np.float32)
    ref[0, :2] = [5.0, 4.99]  # the reference's own top two are a near-tie
    ref[1, :2] = [5.0, 3.0]
    cand = ref.copy()
    cand[0, 1] = 5.1  # picks the runner-up of a near-tie
    cand[1, 1] = 5.1  # picks a token 2 logits below the best
    r = figures.compare(ref, cand, tie_margin=0.05)
    assert r["top1_agreement"] == 0.5
    assert figures.compare(ref, cand, tie_margin=0.0)["top1_agreement"] == 0.0


@pytest.mark.parametrize(
    "report,failing",
    [
        ({"kl_max": 3e-4, "kl_mean": 1e-5, "top1_agreement": 1.0}, ["max KL 0.0003 > 0.00025"]),
        ({"kl_max": 1e-4, "kl_mean": 7e-5, "top1_agreement": 1.0}, ["mean KL 7e-05 > 6e-05"]),
        ({"kl_max": 1e-4, "kl_mean": 1e-5, "top1_agreement": 0.98}, ["top-1 agreement 0.9800 < 0.99"]),
        ({"kl_max": 1.0, "kl_mean": 1.0, "top1_agreement": 0.5}, ["max KL", "mean KL", "top-1 agreement"]),
        ({"kl_max": 2.5e-4, "kl_mean": 6e-5, "top1_agreement": 0.99}, []),  # the limits themselves pass
    ],
)
def test_each_limit_is_its_own_failure(report, failing):
    said = gates.logit.threshold_failures(report, LIMITS)
    assert len(said) == len(failing) and all(s.startswith(f) for s, f in zip(said, failing, strict=True)), said


@pytest.mark.parametrize(
    "lengths, devices, rows, length",
    [
        ([14, 35, 20, 1040], 1, [[3, 1, 2, 0]], 1109),  # the host CPU: one row, no padding
        ([14, 35, 20, 1040], 8, [[3], [1, 2, 0], [], [], [], [], [], []], 1040),  # a row per device
        ([30, 30, 30], 2, [[0], [1], [2], []], 45),  # whole rows per device
        ([50, 40, 40], 1, [[0, 1, 2]], 130),
    ],
)
def test_the_checks_prompts_pack_into_a_row_per_device(lengths, devices, rows, length):
    from stages.in_maxtext.logit_check import packing

    assert packing(lengths, devices) == (rows, length)
    for row in rows:
        assert sum(lengths[i] for i in row) <= length
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
