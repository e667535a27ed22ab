"""The gates: checks that stop a stage when what it made is not good enough. Each gate is a
module here; all speak alike:

  limits    a params section: convert_in.check, convert_out.check (logit), benchmark.gate (benchmark)
  verdict   `failures(figures, limits)`: one phrase per limit broken, naming the limit and the
            figure; empty: it passes
  failure   `GateFailed`: the stage's one line, "the <gate> failed (<phrase>; <phrase>)" and
            what it means, raised after the figures are written as the stage's metrics

  logit      the conversion check (convert_in) and the export check (convert_out): MaxText
             against transformers on the same prompts (figures: stages/shared/logits.py)
  benchmark  the benchmark gate: a tuned score fallen past its limit and its noise
"""

from stages.shared.errors import StageFailed


class GateFailed(StageFailed):
    """A gate's verdict as the stage's one line: which gate, the broken limits, what follows."""

    def __init__(self, gate: str, failures: list[str], then: str):
        super().__init__(f"the {gate} failed ({'; '.join(failures)}){then}")


from stages.lib.gates import benchmark, logit  # noqa: E402  (the gates themselves: gates.logit.failures, ...)

__all__ = ["GateFailed", "benchmark", "logit"]
