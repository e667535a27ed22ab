"""How two sets of next-token logits compare: the logit gate's figures (stages/lib/gates/logit.py
decides on them), computed in MaxText's process by stages/in_maxtext/logit_check.py.
"""

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(reference: np.ndarray, candidate: np.ndarray, tie_margin: float) -> dict:
    """KL(reference || candidate) per position, top-1 agreement, largest logit difference.

    A position agrees when the candidate's top token is within `tie_margin` of the
    reference's best logit (near-ties in the reference are not counted as disagreements).
    """
    lp, lq = log_softmax(reference), log_softmax(candidate)
    kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)
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
