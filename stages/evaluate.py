"""Stage evaluate: is the fine-tuned model better than the base on held-out chats?

    python -m stages.evaluate
    python -m stages.evaluate --dry-run   # print the MaxText command, have MaxText validate it

Held-out loss and perplexity of the base (models/base-maxtext) and the fine-tuned model
(models/sft-maxtext) on data/chat/eval.jsonl, computed by MaxText with the tokenizer, chat
template, completion-only masking and packing training used; then greedy generations for
the recipe's `evaluate.prompts` from both HF checkpoints with `transformers`, side by side
(both in one process: stages/in_maxtext/loss_and_answers.py). Writes
  metrics/eval.json      base / fine-tuned loss and perplexity (DVC metrics)
  eval/generations.md    the prompts and both models' answers
"""

import json
import os
import sys
import tempfile

from stages.lib import families, flags, hardware, maxtext, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load

METRICS = os.path.join("metrics", "eval.json")
GENERATIONS = os.path.join("eval", "generations.md")


def invocation(params: dict, work: str) -> tuple[flags.Invocation, str]:
    """The one MaxText process (stages/in_maxtext/loss_and_answers.py), and its report's path."""
    report, prompts = os.path.join(work, "evaluation.json"), os.path.join(work, "prompts.json")
    with open(prompts, "w") as f:
        json.dump(list(params["evaluate"]["prompts"]), f)
    checkpoints = {"base": paths.BASE_MAXTEXT_PARAMS, "fine_tuned": paths.SFT_PARAMS}
    exports = {"base": paths.BASE_HF, "fine_tuned": paths.SFT_HF}
    return flags.loss_and_answers(params, report, checkpoints, exports, prompts, work), report


def evaluation(params: dict) -> dict:
    """Held-out losses and generations."""
    with tempfile.TemporaryDirectory(prefix="evaluate-") as work:  # MaxText wants an output directory
        job, report = invocation(params, work)
        maxtext.run("evaluate", job, params)
        with open(report) as f:
            return json.load(f)


def write_generations(prompts: list[str], base: list[str], tuned: list[str]) -> None:
    lines = [
        "# Greedy generations: base vs fine-tuned",
        "",
        "Written by the evaluate stage (`python -m stages.evaluate`) from `evaluate.prompts`.",
        "",
    ]
    for i, (prompt, b, t) in enumerate(zip(prompts, base, tuned, strict=True), start=1):
        lines += [
            f"## {i}. {prompt}",
            "",
            "**base**",
            "",
            "> " + (b or "(nothing)").replace("\n", "\n> "),
            "",
            "**fine-tuned**",
            "",
            "> " + (t or "(nothing)").replace("\n", "\n> "),
            "",
        ]
    outputs.write_text(GENERATIONS, "\n".join(lines))


def main() -> None:
    params = load()
    families.check_convertible(paths.BASE_HF, params["model"]["maxtext_name"])
    if "--dry-run" in sys.argv:
        with tempfile.TemporaryDirectory(prefix="evaluate-") as work:
            maxtext.dry_run("evaluate", invocation(params, work)[0], params)
        return
    hardware.check_present(params)
    e = params["evaluate"]
    found = evaluation(params)
    base, tuned = found["loss"]["base"], found["loss"]["fine_tuned"]
    print(f"evaluate: held-out loss: base {base['loss']:.4f}, fine-tuned {tuned['loss']:.4f}", flush=True)
    write_generations(e["prompts"], found["generations"]["base"], found["generations"]["fine_tuned"])
    # Under "eval", as the held-out split's row and token counts are in metrics/dataset.json
    # and metrics/token_lengths.json: one group of columns in `dvc metrics show`.
    outputs.write_json(
        METRICS,
        {
            "eval": {
                "base_loss": base["loss"],
                "fine_tuned_loss": tuned["loss"],
                "base_perplexity": base["perplexity"],
                "fine_tuned_perplexity": tuned["perplexity"],
                "target_tokens": tuned["target_tokens"],
            }
        },
    )
    print(f"evaluate: wrote {METRICS}, {GENERATIONS}", flush=True)


if __name__ == "__main__":
    run(main, "evaluate")
