"""How two sets of next-token logits compare: the logit gate's figures (stages/lib/gates/logit.py
decides on them), computed in MaxText's process by stages/in_maxtext/logit_check.py.
"""

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# Positions per block of the KL: a position's float64 log-probabilities over Gemma 3's 262,144
# words are 2 MB, and each of the six passes over a block then works on 16 MB, not on a whole
# prompt's hundreds. Each position's sums are the same either way (bit for bit); all positions
# at once took 4x as long (1.95 s against 0.49 s for 70 positions, this 2-core machine, 2026-12-06).
ROWS = 8


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) of each position's next-token distributions, in float64."""
    lp, lq = log_softmax(reference), log_softmax(candidate)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def compare(reference: np.ndarray, candidate: np.ndarray, tie_margin: float) -> dict:
    """KL(reference || candidate) per position, top-1 agreement, largest logit difference.

    A position agrees when the candidate's top token is within `tie_margin` of the
    reference's best logit (near-ties in the reference are not counted as disagreements).
    """
    kl = np.concatenate(
        [kl_divergence(reference[i : i + ROWS], candidate[i : i + ROWS]) for i in range(0, len(reference), ROWS)]
    )
    picked = reference[np.arange(len(reference)), candidate.argmax(-1)]
    agree = picked >= reference.max(-1) - tie_margin
    return {
        "tokens": len(reference),
        "kl_max": float(kl.max()),
        "kl_mean": float(kl.mean()),
        "top1_agreement": float(agree.mean()),
        "max_abs_logit_diff": float(np.abs(reference - candidate).max()),
    }


def summary(references: list[np.ndarray], candidates: list[np.ndarray], tie_margin: float) -> dict:
    per_prompt = [compare(r, c, tie_margin) for r, c in zip(references, candidates, strict=True)]
    weights = [p["tokens"] for p in per_prompt]
    return {
        "prompts": per_prompt,
        "kl_max": max(p["kl_max"] for p in per_prompt),
        "kl_mean": float(np.average([p["kl_mean"] for p in per_prompt], weights=weights)),
        "top1_agreement": float(np.average([p["top1_agreement"] for p in per_prompt], weights=weights)),
        "max_abs_logit_diff": max(p["max_abs_logit_diff"] for p in per_prompt),
    }
