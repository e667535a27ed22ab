"""The export gate's verdict, on the parent's side: how two sets of next-token logits compare,
and whether a report passes a stage's limits (`convert_in.check`, `convert_out.check`).

The logits come from the child process that runs MaxText and transformers
(stages/in_maxtext/logit_check.py); it hands the figures over as a JSON report. The stages
read that report and decide here, so the pass/fail rule is plain numpy, tested in-process
(tests/test_export_check_logic.py).
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


def failures(report: dict, limits: dict) -> list[str]:
    """What fails the export (empty: it passes): a config.json that is not the base's, and
    convert_out.check's limits."""
    return [f"config.json differs from the base's: {d}" for d in report["config_differences"]] + threshold_failures(
        report, limits
    )


def threshold_failures(report: dict, limits: dict, what: str = "") -> list[str]:
    """What in a report breaks convert_out.check's limits (empty: it passes): the export
    against its reference and, for LoRA runs, the merge against the unmerged adapter."""
    failures = []
    if report["kl_max"] > limits["max_kl"]:
        failures.append(f"{what}max KL {report['kl_max']:.3g} > {limits['max_kl']:g}")
    if report["kl_mean"] > limits["max_mean_kl"]:
        failures.append(f"{what}mean KL {report['kl_mean']:.3g} > {limits['max_mean_kl']:g}")
    if report["top1_agreement"] < limits["min_top1_agreement"]:
        failures.append(f"{what}top-1 agreement {report['top1_agreement']:.4f} < {limits['min_top1_agreement']:g}")
    if "lora_merge" in report:
        failures += threshold_failures(report["lora_merge"], limits, "LoRA merge: ")
    return failures


LISTS = ("prompts", "config_differences")


def metrics(report: dict, passed: bool, group: str = "export") -> dict:
    """The report as metrics/export_check.json (or convert_in's metrics/convert_check.json,
    `group` "conversion"): every figure under `group` (so that `dvc metrics show` labels them
    export.kl_max, export.rounding.kl_max, ...), the lists (per prompt, config differences)
    beside it, where DVC's tables do not spread them out."""
    figures = {k: v for k, v in report.items() if k not in LISTS}
    return {group: {"passed": passed, **figures}, **{k: report[k] for k in LISTS if k in report}}


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
