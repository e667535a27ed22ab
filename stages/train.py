"""Stage train: supervised fine-tuning with MaxText's SFT trainer (Tunix), on the local data.

    python -m stages.train             # run
    python -m stages.train --dry-run   # print the MaxText command, have MaxText validate it

Runs `maxtext.trainers.post_train.sft.train_sft` from models/base-maxtext/ on
data/chat/train.jsonl and writes
  models/sft-maxtext/   params/: the final full parameters (Orbax), input to convert_out;
                        lora/: with train.lora.enabled, the adapter, merged into params/
                        by stages/in_maxtext/merge_lora.py
  dvclive/              DVCLive's record, written step by step while MaxText trains:
                        plots/metrics/train/*.tsv (loss, learning rate, grad norm, throughput
                        per step), plots/metrics/eval/*.tsv (held-out loss every
                        train.eval_interval steps), metrics.json (latest values; at the end
                        the run's summary: final loss, tokens/s, step time, MFU)

With hardware.hosts > 1 (a multi-host TPU slice, or processes on this CPU) the same training
runs as one JAX job on every host, started by runtime.launcher (stages/lib/launch.py), its
inputs staged on the gs:// scratch (stages/lib/train_data.py).

MaxText works in <runtime.scratch_dir>/train-<digest of what it trains> (stages/lib/workdir.py),
outside DVC's outputs, keeping the newest runtime.keep_checkpoints checkpoints. A run that
was killed leaves it behind; the next `dvc repro` with the same inputs finds it and MaxText
restores the newest complete checkpoint, with the data stream continued where those steps
left it (stages/lib/stream.py, stages/in_maxtext/data_position.py).

Reading it: main() below is the run in order; each step's module, in the order it is used:
  stages/lib/params.py         params.yaml, validated, every key read noted (load)
  stages/lib/workdir.py        MaxText's working directory, named by what it trains; the
                               scratch layout; checkpoints found, pruned, fetched
  stages/lib/hardware.py       the accelerator is here; the disk holds a run
  stages/lib/train_data.py     the data stream MaxText reads (stages/lib/stream.py writes it),
                               continued after a resume; a multi-host job's inputs on gs://
  stages/lib/flags.py          params -> MaxText's command line (flags.train)
  stages/lib/maxtext_process.py        one MaxText process: its log, progress lines, signals
  stages/lib/launch.py         ... or a job of one process per host (launcher local, slice, xpk)
  stages/in_maxtext/main.py    what that process runs: MaxText's entry point, unmodified
  stages/lib/train_metrics.py  MaxText's per-step metrics -> DVCLive, live, and the summary
  stages/in_maxtext/merge_lora.py  (LoRA) the adapter merged into full weights
"""

import os
import sys

from stages.lib import (
    flags,
    hardware,
    launch,
    long_rows,
    maxtext_process,
    outputs,
    paths,
    train_data,
    train_metrics,
    workdir,
)
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import checkpoint, families
from stages.shared.errors import StageFailed

PROFILE = os.path.join("logs", "profile")


def train(params: dict, work: workdir.Workdir, curve: train_metrics.Curve, rows: long_rows.Fitted) -> None:
    """Runs MaxText on `rows` until the final checkpoint exists (at once, if a killed run left
    it), logging its metrics to `curve` as it goes (a resumed run's begin with the killed one's)."""
    total, keep = params["train"]["steps"], params["runtime"]["keep_checkpoints"]
    done = max([s for s in work.complete_steps() if s <= total], default=0)
    if done == total:
        print(f"train: the final checkpoint (step {done}) is already there; publishing it", flush=True)
        return
    interval = params["train"]["eval_interval"]
    curve.add(train_metrics.steps(work.metrics_file), train_metrics.evals(work.metrics_file, interval), up_to=done)
    progress = train_metrics.reporter(work.metrics_file, total, interval, on_poll=work.keeper(keep), curve=curve)
    streams = train_data.streams_from(params, work, done, rows)
    job = train_data.invocation(flags.train, params, work, streams, train_data.SFT)
    launch.run("train", job, params, work.name, progress)
    work.prune(keep)
    work.save(workdir.METRICS_FILE)
    if total not in work.complete_steps():
        logged = train_metrics.steps(work.metrics_file)
        raise StageFailed(
            f"training stopped at step {int(logged[-1]['step']) if logged else 0} of {total} without a final "
            "checkpoint; "
            f"if the data ran out, raise train.num_epochs (now {params['train']['num_epochs']}) or lower train.steps"
        )


def publish(params: dict, work: workdir.Workdir) -> None:
    """The final checkpoint's parameters into models/sft-maxtext (LoRA: adapter and merge)."""
    final = f"{work.checkpoints}/{params['train']['steps']}/model_params"
    with outputs.staged_dir(paths.SFT_MAXTEXT) as tmp:
        trained = os.path.join(tmp, "lora" if flags.lora_enabled(params) else "params")
        work.fetch(final, trained)
        if flags.lora_enabled(params):
            maxtext_process.run("train.merge", flags.merge_lora(params, trained, os.path.join(tmp, "params")), params)


def keep_profile(params: dict, work: workdir.Workdir) -> None:
    """MaxText's trace (runtime.profile_steps) where a user looks: logs/profile/, never a DVC
    output; `xprof --logdir logs/profile` (or TensorBoard's profile plugin) opens it."""
    if params["runtime"]["profile_steps"] and work.fs.exists(work.profile):
        outputs.remove(PROFILE)
        work.fetch(work.profile, os.path.join(PROFILE, "plugins", "profile"))
        print(
            f"train: profile of {params['runtime']['profile_steps']} steps in {PROFILE}/ "
            f"(open it: xprof --logdir {PROFILE})",
            flush=True,
        )


def main() -> None:
    params = load()
    families.check_convertible(paths.BASE_HF, params["model"]["maxtext_name"])
    work = workdir.for_params(params)
    if "--dry-run" in sys.argv:
        streams = train_data.stream_names(params, work)
        job = train_data.invocation(flags.train, params, work, streams, train_data.SFT, upload=False)
        launch.dry_run("train", job, params, work.name)
        return
    hardware.check_present(params)
    hardware.check_training_disk(
        params, work.url, checkpoint.parameter_count(paths.BASE_HF), paths.SFT_MAXTEXT, flags.lora_enabled(params)
    )
    with work.lock():
        print(f"train: working directory {work.url}", flush=True)
        rows = long_rows.fit(params, work.local)
        print(f"train: {long_rows.said(rows.summary, params['train']['max_target_length'])}", flush=True)
        train_data.check_enough_data(params, rows)
        work.restore(workdir.METRICS_FILE)
        for other in work.others():
            # Not deleted: going back to those params resumes it. Said, because on a 4B run
            # each holds tens of GB.
            print(
                f"train: note: {other} is left from an interrupted run with other inputs; "
                "delete it unless you will go back to those params",
                flush=True,
            )
        curve = train_metrics.Curve()
        train(params, work, curve, rows)
        publish(params, work)
        keep_profile(params, work)
        done = train_metrics.steps(work.metrics_file)
        evaluations = train_metrics.evals(work.metrics_file, params["train"]["eval_interval"])
        curve.add(done, evaluations)  # what the last poll did not see
        curve.end(
            {
                **train_metrics.summary(done, evaluations, params["hardware"]["kind"]),
                **rows.summary,
            }
        )
        if not params["runtime"]["keep_scratch"]:
            work.remove()
    print(f"train: wrote {paths.SFT_MAXTEXT} and {train_metrics.LIVE_DIR}/", flush=True)


if __name__ == "__main__":
    run(main, "train")
