"""Stage evaluate: is the fine-tuned model better than the base on held-out chats?

    python -m stages.evaluate
    python -m stages.evaluate --dry-run   # print the MaxText command, have MaxText validate it

Held-out loss and perplexity of the base (models/base-maxtext) and the fine-tuned model
(models/sft-maxtext) on data/chat/eval.jsonl, as training's in-training evaluation computes
it (MaxText's loss with the tokenizer, completion-only masking, packing and batch size
training used, averaged over the batches as Tunix does), on the conversations rendered as
they are served (stages/shared/rendering.py), whatever train.chat_rendering trained on. Where training already
evaluated at step 0 (the base: a LoRA adapter starts at zero) and at its last step
(train.eval_interval divides train.steps, as in the TPU recipes), those figures are taken
from its DVCLive files and no model is loaded at all; otherwise MaxText computes them here
(stages/in_maxtext/heldout.py). After preference tuning (models/preference-maxtext holds
parameters), also the tuned model's held-out loss and, on the held-out pairs
(data/preference/eval.jsonl), how often the SFT and the tuned model prefer the chosen answer
and the reward train_dpo optimises (docs/preference.md). (The greedy answers of both models
are the benchmark stage's, made on the models it loads anyway: eval/generations.md.) Writes
  metrics/eval.json      base / fine-tuned loss and perplexity, and where they were computed
"""

import json
import math
import os
import sys
import tempfile

from stages.lib import flags, hardware, maxtext_process, outputs, paths, train_metrics
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import families

METRICS = os.path.join("metrics", "eval.json")
PREFERENCE_TUNED = "preference_tuned"


def from_training(params: dict) -> dict | None:
    """The held-out losses training computed at step 0 and at its last step, as
    heldout.heldout_loss reports them, or None where it did not compute both, or computed
    them on conversations rendered otherwise than as served (train.chat_rendering)."""
    t = params.train
    logged = train_metrics.logged_evals()
    if (
        not flags.served(params)
        or not t["eval_interval"]
        or t["steps"] % t["eval_interval"]
        or not {0, t["steps"]} <= logged.keys()
    ):
        return None
    return {
        name: {
            "loss": logged[step]["loss"],
            "perplexity": math.exp(min(logged[step]["loss"], 50.0)),
            "target_tokens": int(logged[step]["target_tokens"]),
        }
        for name, step in (("base", 0), ("fine_tuned", t["steps"]))
    }


def preference_settings() -> dict | None:
    """How the preference stage tuned its model (None: it was off)."""
    if not os.path.isdir(paths.PREFERENCE_PARAMS):
        return None
    return outputs.read_json(os.path.join(paths.PREFERENCE_MAXTEXT, paths.PREFERENCE_SETTINGS))


def invocation(params: dict, work: str, losses: bool = True) -> tuple[flags.Invocation | None, str]:
    """The one MaxText process (stages/in_maxtext/heldout.py), and its report's path; `losses`:
    whether it computes the base's and the SFT model's held-out losses. With preference tuning,
    the tuned model's loss, and both models' held-out pair scores. None: nothing to compute."""
    report = os.path.join(work, "evaluation.json")
    checkpoints = {"base": paths.BASE_MAXTEXT_PARAMS, "fine_tuned": paths.SFT_PARAMS} if losses else {}
    preference, pairs = preference_settings(), None
    if preference:
        checkpoints[PREFERENCE_TUNED] = paths.PREFERENCE_PARAMS
        pairs = {"sft": paths.SFT_PARAMS, PREFERENCE_TUNED: paths.PREFERENCE_PARAMS}  # the reference first
    if not checkpoints:
        return None, report
    return flags.heldout(params, report, checkpoints, work, pairs, preference), report


def evaluation(params: dict) -> dict:
    """Held-out losses, training's or computed here (and the pair scores after preference tuning)."""
    trained = from_training(params)
    found = {"loss": {}}
    with tempfile.TemporaryDirectory(prefix="evaluate-") as work:  # MaxText wants an output directory
        job, report = invocation(params, work, losses=trained is None)
        if job:
            maxtext_process.run("evaluate", job, params)
            with open(report) as f:
                found = json.load(f)
    if trained:
        found["loss"].update(trained)
    found["loss_from"] = "training" if trained else "evaluate"
    return found


def preference_metrics(found: dict) -> dict:
    """With preference tuning: the tuned model's held-out loss, and both models' scores on the
    held-out pairs (stages/in_maxtext/heldout.py: preference_scores)."""
    if "pairs" not in found:
        return {}
    tuned, sft, pairs = found["loss"][PREFERENCE_TUNED], found["pairs"]["sft"], found["pairs"][PREFERENCE_TUNED]
    return {
        "preference_tuned_loss": tuned["loss"],
        "preference_tuned_perplexity": tuned["perplexity"],
        "pairs": pairs["pairs"],
        "sft_preference_accuracy": sft["preference_accuracy"],
        "preference_tuned_preference_accuracy": pairs["preference_accuracy"],
        "sft_logp_margin": sft["logp_margin"],
        "preference_tuned_logp_margin": pairs["logp_margin"],
        "reward_accuracy": pairs["reward_accuracy"],  # Tunix's, against the SFT model (DPO)
        "reward_margin": pairs["reward_margin"],
    }


def main() -> None:
    params = load()
    families.check_convertible(paths.BASE_HF, params.model.maxtext_name)
    if "--dry-run" in sys.argv:
        with tempfile.TemporaryDirectory(prefix="evaluate-") as work:
            maxtext_process.dry_run("evaluate", invocation(params, work)[0], params)
        return
    hardware.check_present(params)
    found = evaluation(params)
    base, tuned = found["loss"]["base"], found["loss"]["fine_tuned"]
    print(
        f"evaluate: held-out loss: base {base['loss']:.4f}, fine-tuned {tuned['loss']:.4f}"
        f" (computed by {found['loss_from']})",
        flush=True,
    )
    if "pairs" in found:
        sft, pt = found["pairs"]["sft"], found["pairs"][PREFERENCE_TUNED]
        print(
            f"evaluate: held-out pairs ({pt['pairs']}): chosen the likelier answer SFT {sft['preference_accuracy']:.3f}"
            f" -> preference-tuned {pt['preference_accuracy']:.3f}; reward accuracy {pt['reward_accuracy']:.3f},"
            f" margin {pt['reward_margin']:.4f}; held-out chat loss {found['loss'][PREFERENCE_TUNED]['loss']:.4f}",
            flush=True,
        )
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
                **preference_metrics(found),
            }
        },
    )
    print(f"evaluate: wrote {METRICS}", flush=True)


if __name__ == "__main__":
    run(main, "evaluate")
