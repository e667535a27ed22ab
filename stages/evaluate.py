"""Stage evaluate: is the fine-tuned model better than the base on held-out chats?

    python -m stages.evaluate
    python -m stages.evaluate --dry-run   # print the MaxText command, have MaxText validate it

Held-out loss and perplexity of the base (models/base-maxtext) and the fine-tuned model
(models/sft-maxtext) on data/chat/eval.jsonl, as training's in-training evaluation computes
it (MaxText's loss with the tokenizer, chat template, completion-only masking, packing and
batch size training used, averaged over the batches as Tunix does). Where training already
evaluated at step 0 (the base: a LoRA adapter starts at zero) and at its last step
(train.eval_interval divides train.steps, as in the TPU recipes), those figures are taken
from its DVCLive files and no pass is made again; otherwise MaxText computes them here. Then
greedy generations for the recipe's `evaluate.prompts` from both HF checkpoints with
`transformers`, side by side, all prompts in one batch (both in one process:
stages/in_maxtext/loss_and_answers.py). Writes
  metrics/eval.json      base / fine-tuned loss and perplexity, and where they were computed
  eval/generations.md    the prompts and both models' answers
"""

import json
import math
import os
import sys
import tempfile

from stages.lib import families, flags, hardware, maxtext, outputs, paths, train_metrics
from stages.lib.cli import run
from stages.lib.params import load

METRICS = os.path.join("metrics", "eval.json")
GENERATIONS = os.path.join("eval", "generations.md")


def from_training(params: dict) -> dict | None:
    """The held-out losses training computed at step 0 and at its last step, as
    loss_and_answers.heldout_loss reports them, or None where it did not compute both."""
    t = params["train"]
    logged = train_metrics.logged_evals()
    if not t["eval_interval"] or t["steps"] % t["eval_interval"] or not {0, t["steps"]} <= logged.keys():
        return None
    return {
        name: {
            "loss": logged[step]["loss"],
            "perplexity": math.exp(min(logged[step]["loss"], 50.0)),
            "target_tokens": int(logged[step]["target_tokens"]),
        }
        for name, step in (("base", 0), ("fine_tuned", t["steps"]))
    }


def invocation(params: dict, work: str, losses: bool = True) -> tuple[flags.Invocation, str]:
    """The one MaxText process (stages/in_maxtext/loss_and_answers.py), and its report's path;
    `losses`: whether it computes the held-out losses too."""
    report, prompts = os.path.join(work, "evaluation.json"), os.path.join(work, "prompts.json")
    with open(prompts, "w") as f:
        json.dump(list(params["evaluate"]["prompts"]), f)
    checkpoints = {"base": paths.BASE_MAXTEXT_PARAMS, "fine_tuned": paths.SFT_PARAMS} if losses else {}
    exports = {"base": paths.BASE_HF, "fine_tuned": paths.SFT_HF}
    return flags.loss_and_answers(params, report, checkpoints, exports, prompts, work), report


def evaluation(params: dict) -> dict:
    """Held-out losses (training's, or computed) and generations."""
    trained = from_training(params)
    with tempfile.TemporaryDirectory(prefix="evaluate-") as work:  # MaxText wants an output directory
        job, report = invocation(params, work, losses=trained is None)
        maxtext.run("evaluate", job, params)
        with open(report) as f:
            found = json.load(f)
    if trained:
        found["loss"] = trained
    found["loss_from"] = "training" if trained else "evaluate"
    return found


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
    print(
        f"evaluate: held-out loss: base {base['loss']:.4f}, fine-tuned {tuned['loss']:.4f}"
        f" (computed by {found['loss_from']})",
        flush=True,
    )
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
                "loss_from": found["loss_from"],  # training (its step-0 and last evaluations) or evaluate
            }
        },
    )
    print(f"evaluate: wrote {METRICS}, {GENERATIONS}", flush=True)


if __name__ == "__main__":
    run(main, "evaluate")
