"""The logit gate: the conversion check (`convert_in.check`) and the export check
(`convert_out.check`) decide here whether a report passes their limits.

The child process that runs MaxText and transformers (stages/in_maxtext/logit_check.py)
computes the figures (stages/shared/logits.py: KL, top-1 agreement, per prompt) and hands
them over as a JSON report; the stages read it and decide here, in plain Python, tested
in-process (tests/test_export_check_logic.py).
"""


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
