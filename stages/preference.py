"""Stage preference: preference tuning after SFT with MaxText's own trainer (DPO or ORPO).

    python -m stages.preference             # run (a no-op while preference.enabled is false)
    python -m stages.preference --dry-run   # print the MaxText command, have MaxText validate it

With `preference.enabled`, runs `maxtext.trainers.post_train.dpo.train_dpo` (Tunix's
DPOTrainer) from the SFT parameters (models/sft-maxtext/params) on the pairs of
data/preference/train.jsonl, and writes
  models/preference-maxtext/params/   the final parameters (Orbax): what convert_out exports,
                                      evaluate and the benchmark then judge
  dvclive-preference/                 DVCLive's record, step by step while MaxText trains: the
                                      preference loss, learning rate, grad norm, throughput and
                                      the reward accuracy and margin as MaxText reports them
                                      (Tunix's means over the steps of the running process)
`preference.algorithm: dpo` holds a frozen copy of the SFT model as the reference
(train_dpo's `nnx.clone`); `orpo` needs none. Off, both outputs hold a note (always the same
bytes), so the stages after it find their cached results.

As train does: MaxText works in <runtime.scratch_dir>/preference-<digest of what it trains>
(stages/lib/workdir.py); the stage writes the pairs' stream already shuffled (the order of
preference.seed, every epoch), and a killed run's next `dvc repro` resumes from the newest
complete checkpoint with the stream continued after the pairs those steps used (no packing:
steps x pairs per step). On a TPU kind it first checks the fit (stages/lib/fit.py's
compile of the step at twice the pairs, plus the reference model's parameters: see
`check_fit`). The run itself is the training skeleton's (stages/lib/training.py), as train's.
With hardware.hosts > 1 it runs as train does: one JAX job on every host,
started by runtime.launcher (stages/lib/launch.py), each host reading its own share of the
pairs, the SFT model and the tokenizer staged on the gs:// scratch (stages/lib/train_data.py).
No LoRA: train_dpo has no LoRA path.
"""

import os
import sys

from stages.lib import fit, flags, hardware, outputs, paths, train_data, train_metrics, training, workdir
from stages.lib.cli import run
from stages.shared import contract

LIVE_DIR = "dvclive-preference"
# MaxText's DPO metrics beside train's (hooks.py: learning/reward_accuracy, learning/reward_margin).
TRAIN_KEYS = {
    **train_metrics.TRAIN_KEYS,
    "reward_accuracy": "learning/reward_accuracy",
    "reward_margin": "learning/reward_margin",
}
OFF_TEXT = (
    "Preference tuning is off (`preference.enabled: false`): convert_out exports the SFT model\n"
    "(models/sft-maxtext). Turn it on with `dvc exp run -S preference.enabled=true` (docs/preference.md).\n"
)


def write_off() -> None:
    with outputs.staged_dir(paths.PREFERENCE_MAXTEXT) as tmp:
        outputs.write_text(os.path.join(tmp, paths.OFF_NOTE), OFF_TEXT)
    with outputs.staged_dir(LIVE_DIR) as tmp:
        os.makedirs(os.path.join(tmp, "plots"))
        outputs.write_text(os.path.join(tmp, "plots", paths.OFF_NOTE), OFF_TEXT)
        outputs.write_json(os.path.join(tmp, "metrics.json"), {"run": {"enabled": False}})


def settings(params: dict) -> dict:
    """How the model was tuned, kept beside it: what evaluate needs to score pairs as
    training did, without declaring (and re-running on) preference params of its own."""
    keys = ("algorithm", "beta", "orpo_lambda", "max_target_length", "max_prompt_length", "per_device_batch_size")
    return {k: params.preference[k] for k in keys}


def pairs_per_step(params: dict) -> int:
    p = params.preference
    return p["per_device_batch_size"] * hardware.devices_per_host(params) * p["gradient_accumulation_steps"]


def streams_from(params: dict, work: workdir.Workdir, step: int) -> list[str]:
    """The pairs each host reads (one stream for one host): every epoch, shuffled, from the
    first pair `step` steps did not use (MaxText's DPO pipeline neither packs nor drops a pair:
    each step takes exactly pairs_per_step of each host's stream)."""
    p = params.preference
    pairs = os.path.join(paths.PREFERENCE_DATA, "train.jsonl")
    full = train_data.write_streams(params, work, pairs, p["seed"], p["num_epochs"])
    if step == 0:
        return full
    used = [step * pairs_per_step(params)] * len(full)
    resumed, left = train_data.continue_streams(params, work, step, full, used)
    print(f"preference: resuming at step {step}: {left} pairs of the stream left", flush=True)
    return resumed


def check_fit(params: dict) -> dict | None:
    """On a TPU kind: does a preference step fit the chips? MaxText compiles no DPO step ahead
    of time (train_compile refuses use_dpo), so fit_check's compile of the train step is made
    at what DPO's step holds: twice the sequences (each pair's chosen and rejected run in one
    batch) at preference.max_target_length, and, for DPO, the reference model's parameters
    (a frozen float32 copy of the policy's, sharded as they are) added to it.
    A projection from a measured compile, said as such in metrics and docs."""
    kind = params.hardware.kind
    if kind not in hardware.TPUS:
        return None
    p = params.preference
    overrides = {
        "per_device_batch_size": 2 * p["per_device_batch_size"],
        "gradient_accumulation_steps": p["gradient_accumulation_steps"],
        "max_target_length": p["max_target_length"],
    }
    compiled = fit.compile_once(params, overrides)
    # The reference is one more copy of the policy's float32 parameters, sharded as they are:
    # a third of the compiled step's arguments (parameters and Adam's two moments, float32).
    reference = compiled["per_chip_gib"]["arguments"] / 3 * fit.GIB if p["algorithm"] == "dpo" else 0
    total = compiled["per_chip_gib"]["total"] + reference / fit.GIB
    verdict = {
        "step_compiled_gib": compiled["per_chip_gib"]["total"],
        "reference_model_gib": reference / fit.GIB,
        "total_gib": total,
        "hbm_gib": compiled["hbm_gib"],
        "fits": total <= compiled["hbm_gib"],
    }
    print(
        f"preference: fit on a {kind}: the step at {overrides['per_device_batch_size']} sequences of "
        f"{p['max_target_length']} a chip {verdict['step_compiled_gib']:.1f} GiB + the reference model "
        f"{verdict['reference_model_gib']:.1f} GiB = {total:.1f} of {verdict['hbm_gib']:.0f} GiB per chip",
        flush=True,
    )
    if not verdict["fits"]:
        raise fit.DoesNotFit(
            f"preference tuning needs ~{total:.1f} GiB per chip, over a {kind}'s {verdict['hbm_gib']:.0f} GiB: "
            "lower preference.per_device_batch_size (and raise gradient_accumulation_steps) or max_target_length"
        )
    return verdict


class Preference(training.TrainingStage):
    name, section, what = "preference", "preference", "preference tuning"
    run_name = contract.PREFERENCE_RUN_NAME
    inputs = train_data.PREFERENCE
    output = paths.PREFERENCE_MAXTEXT
    live_dir, train_keys = LIVE_DIR, TRAIN_KEYS
    build = staticmethod(flags.preference)
    fitted: dict | None = None  # check_fit's verdict (None: a CPU kind, or a resumed run)

    def skipped(self, params: dict) -> bool:
        if params.preference.enabled:
            return False
        if "--dry-run" not in sys.argv:
            write_off()
        print("preference: preference.enabled is false; the SFT model is the result", flush=True)
        return True

    def prepare(self, params: dict, work: workdir.Workdir) -> None:
        # A resumed run fitted before: the compile (minutes at 4B, on the host) is not repeated.
        self.fitted = None if work.complete_steps() else check_fit(params)

    def streams_from(self, params: dict, work: workdir.Workdir, step: int) -> list[str]:
        return streams_from(params, work, step)

    def publish(self, params: dict, work: workdir.Workdir, final: str, out: str) -> None:
        work.fetch(final, os.path.join(out, "params"))
        outputs.write_json(os.path.join(out, paths.PREFERENCE_SETTINGS), settings(params))

    def summary(self, params: dict, done: list[dict]) -> dict:
        last = done[-1] if done else {}
        return {
            "algorithm": params.preference.algorithm,
            "reward_accuracy": last.get("learning/reward_accuracy"),
            "reward_margin": last.get("learning/reward_margin"),
            "fit": self.fitted,
        }


if __name__ == "__main__":
    run(Preference().main, "preference")
