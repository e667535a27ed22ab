"""The benchmark gate (`benchmark.gate`): per task, how far the fine-tuned model's score may fall
below the base's (`max_drop`), a floor it must reach (`min_score`), and the noise a fall may
hide in (`stderrs`: standard errors of the difference, from lm-eval's per-model errors).
stages/benchmark.py writes the scores, then raises gates.GateFailed on these failures.
"""

import math


def failures(found: dict, gate: dict | None) -> list[str]:
    """One phrase per task past its limits (benchmark.gate): both scores and the limit. A fall
    counts only where it is over max_drop and over `stderrs` standard errors of the difference
    (sqrt of the two errors squared): a fall within the scores' own noise is no regression."""
    failures = []
    for name, limits in (gate or {}).items():
        s = found[name]
        drop = s["base"] - s["fine_tuned"]
        errors = [s.get("base_stderr"), s.get("fine_tuned_stderr")]
        noise = math.hypot(*errors) * (limits.get("stderrs") or 0) if None not in errors else 0.0
        if limits["max_drop"] is not None and drop > limits["max_drop"] and drop > noise:
            failures.append(
                f"{name}: fine-tuned {s['fine_tuned']:.4f} vs base {s['base']:.4f}, a fall of {drop:.4f},"
                f" more than benchmark.gate.{name}.max_drop {limits['max_drop']}"
                + (f" and than its noise ({limits['stderrs']} standard errors: {noise:.4f})" if noise else "")
            )
        if limits["min_score"] is not None and s["fine_tuned"] < limits["min_score"]:
            failures.append(
                f"{name}: fine-tuned {s['fine_tuned']:.4f} (base {s['base']:.4f}),"
                f" below benchmark.gate.{name}.min_score {limits['min_score']}"
            )
    return failures
