"""Stage train: supervised fine-tuning with MaxText's SFT trainer (Tunix), on the local data.

    python -m stages.train             # run
    python -m stages.train --dry-run   # print the MaxText command, have MaxText validate it

Runs `maxtext.trainers.post_train.sft.train_sft` from models/base-maxtext/ on
data/chat/train.jsonl and writes
  models/sft-maxtext/   params/: the final full parameters (Orbax), input to convert_out;
                        lora/: with train.lora.enabled, the adapter, merged into params/
                        by stages/lib/merge_lora.py
  dvclive/              DVCLive's record, written step by step while MaxText trains:
                        plots/metrics/train/*.tsv (loss, learning rate, grad norm, throughput
                        per step), plots/metrics/eval/*.tsv (held-out loss every
                        train.eval_interval steps), metrics.json (latest values; at the end
                        the run's summary: final loss, tokens/s, step time, MFU)

MaxText works in <runtime.scratch_dir>/train-<digest of what it trains> (stages/lib/workdir.py),
outside DVC's outputs, keeping the newest runtime.keep_checkpoints checkpoints. A run that
was killed leaves it behind; the next `dvc repro` with the same inputs finds it and MaxText
restores the newest complete checkpoint, with the data stream continued where those steps
left it (stages/lib/stream.py, stages/lib/data_position.py).
"""

import json
import os
import sys

import numpy as np

from stages.lib import flags, gemma3, hardware, maxtext, outputs, paths, stream, train_metrics, workdir
from stages.lib.cli import StageFailed, run
from stages.lib.params import load

PROFILE = os.path.join("logs", "profile")


def count_truncated(params: dict) -> int:
    """Conversations longer than train.max_target_length (from the token_lengths stage): said,
    since MaxText cuts them silently and their ends, usually the answer, are never trained on."""
    max_length = params["train"]["max_target_length"]
    lengths = np.load(os.path.join(paths.LENGTHS, "train.npy"))
    too_long = int((lengths > max_length).sum())
    if too_long:
        print(f"train: {too_long} of {len(lengths)} training conversations are longer than train.max_target_length="
              f"{max_length} tokens; MaxText truncates them, so their ends are never trained on", flush=True)
    return too_long


def data_for(params: dict, work: workdir.Workdir, step: int) -> str:
    """The stream MaxText reads: from its start, or after the rows `step` finished steps used."""
    t = params["train"]
    full = os.path.join(work.local, "stream.jsonl")
    if not os.path.exists(full):
        packing = stream.packing_for(params, np.load(os.path.join(paths.LENGTHS, "train.npy")))
        stream.write(os.path.join(paths.DATA, "train.jsonl"), full, t["seed"], t["num_epochs"], packing)
    if step == 0:
        return full
    report = f"position-{step}.json"  # computed once per resume point, kept beside the checkpoints
    work.restore(report)
    if not os.path.exists(os.path.join(work.local, report)):
        maxtext.run("train.data_position", flags.data_position(params, work.url, full, step, os.path.join(work.local, report)),
                    params)
        work.save(report)
    with open(os.path.join(work.local, report)) as f:
        consumed = json.load(f)["rows"]
    resumed = os.path.join(work.local, f"stream-from-step-{step}.jsonl")
    stream.skip(full, consumed, resumed)
    print(f"train: resuming at step {step}: the data stream continues after the {consumed} conversations "
          "those steps trained on", flush=True)
    return resumed


def keeper(work: workdir.Workdir, keep: int):
    """Run at every progress poll: prunes old checkpoints, and saves the metrics lines beside
    the newest checkpoint once they reach its step (what a resume on another VM continues)."""
    saved_through = [0]

    def poll() -> None:
        work.prune(keep)
        newest = max(work.complete_steps(), default=0)
        if newest > saved_through[0]:
            logged = train_metrics.steps(work.metrics_file)
            if logged and int(logged[-1]["step"]) >= newest:
                work.save(workdir.METRICS_FILE)
                saved_through[0] = newest

    return poll


def train(params: dict, work: workdir.Workdir, curve: train_metrics.Curve) -> None:
    """Runs MaxText until the final checkpoint exists (at once, if a killed run left it),
    logging its metrics to `curve` as it goes (a resumed run's begin with the killed one's)."""
    total, keep = params["train"]["steps"], params["runtime"]["keep_checkpoints"]
    done = max([s for s in work.complete_steps() if s <= total], default=0)
    if done == total:
        print(f"train: the final checkpoint (step {done}) is already there; publishing it", flush=True)
        return
    interval = params["train"]["eval_interval"]
    curve.add(train_metrics.steps(work.metrics_file), train_metrics.evals(work.metrics_file, interval), up_to=done)
    invocation = flags.train(params, work.url, work.metrics_file, data_for(params, work, done))
    maxtext.run("train", invocation, params,
                progress=train_metrics.reporter(work.metrics_file, total, interval, on_poll=keeper(work, keep), curve=curve))
    work.prune(keep)
    work.save(workdir.METRICS_FILE)
    if total not in work.complete_steps():
        logged = train_metrics.steps(work.metrics_file)
        raise StageFailed(
            f"training stopped at step {int(logged[-1]['step']) if logged else 0} of {total} without a final checkpoint; "
            f"if the data ran out, raise train.num_epochs (now {params['train']['num_epochs']}) or lower train.steps")


def publish(params: dict, work: workdir.Workdir) -> None:
    """The final checkpoint's parameters into models/sft-maxtext (LoRA: adapter and merge)."""
    final = f"{work.checkpoints}/{params['train']['steps']}/model_params"
    with outputs.staged_dir(paths.SFT_MAXTEXT) as tmp:
        trained = os.path.join(tmp, "lora" if flags.lora_enabled(params) else "params")
        work.fetch(final, trained)
        if flags.lora_enabled(params):
            maxtext.run("train.merge", flags.merge_lora(params, trained, os.path.join(tmp, "params")), params)


def keep_profile(params: dict, work: workdir.Workdir) -> None:
    """MaxText's trace (runtime.profile_steps) where a user looks: logs/profile/, never a DVC
    output; `xprof --logdir logs/profile` (or TensorBoard's profile plugin) opens it."""
    if params["runtime"]["profile_steps"] and work.fs.exists(work.profile):
        outputs.remove(PROFILE)
        work.fetch(work.profile, os.path.join(PROFILE, "plugins", "profile"))
        print(f"train: profile of {params['runtime']['profile_steps']} steps in {PROFILE}/ "
              f"(open it: xprof --logdir {PROFILE})", flush=True)


def main() -> None:
    params = load()
    gemma3.check_convertible(paths.BASE_HF, params["model"]["maxtext_name"])
    work = workdir.for_params(params)
    if "--dry-run" in sys.argv:
        stream_path = os.path.join(work.local, "stream.jsonl")
        maxtext.dry_run("train", flags.train(params, work.url, work.metrics_file, stream_path), params)
        return
    hardware.check_present(params)
    hardware.check_training_disk(params, work.url, gemma3.parameter_count(paths.BASE_HF), paths.SFT_MAXTEXT,
                                 flags.lora_enabled(params))
    truncated = count_truncated(params)
    with work.lock():
        print(f"train: working directory {work.url}", flush=True)
        work.restore(workdir.METRICS_FILE)
        for other in work.others():
            # Not deleted: going back to those params resumes it. Said, because on a 4B run
            # each holds tens of GB.
            print(f"train: note: {other} is left from an interrupted run with other inputs; "
                  "delete it unless you will go back to those params", flush=True)
        curve = train_metrics.Curve()
        train(params, work, curve)
        publish(params, work)
        keep_profile(params, work)
        done = train_metrics.steps(work.metrics_file)
        evaluations = train_metrics.evals(work.metrics_file, params["train"]["eval_interval"])
        curve.add(done, evaluations)  # what the last poll did not see
        curve.end({**train_metrics.summary(done, evaluations, params["hardware"]["kind"]), "conversations_truncated": truncated})
        if not params["runtime"]["keep_scratch"]:
            work.remove()
    print(f"train: wrote {paths.SFT_MAXTEXT} and {train_metrics.LIVE_DIR}/", flush=True)


if __name__ == "__main__":
    run(main, "train")
