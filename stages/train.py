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

Reading it: the run in order is the training skeleton's main() (stages/lib/training.py,
which preference tuning runs too); below is what SFT does differently. Each step's module, in
the order it is used:
  stages/lib/training.py       the skeleton: the steps below, in order
  stages/lib/params.py         params.yaml, validated, every key read noted (load)
  stages/lib/workdir.py        MaxText's working directory, named by what it trains; the
                               scratch layout; checkpoints found, pruned, fetched
  stages/lib/hardware.py       the accelerator is here; the disk holds a run
  stages/lib/long_rows.py      conversations longer than train.max_target_length: kept, cut or left out
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
import shutil

from stages.lib import flags, long_rows, maxtext_process, outputs, paths, train_data, training, workdir
from stages.lib.cli import run
from stages.shared import contract

PROFILE = os.path.join("logs", "profile")


class Train(training.TrainingStage):
    name, section, what = "train", "train", "training"
    run_name = contract.SFT_RUN_NAME
    inputs = train_data.SFT
    output = paths.SFT_MAXTEXT
    build = staticmethod(flags.train)
    rows: long_rows.Fitted

    def lora(self, params: dict) -> bool:
        return flags.lora_enabled(params)

    def eval_interval(self, params: dict) -> int:
        return params.train.eval_interval

    def prepare(self, params: dict, work: workdir.Workdir) -> None:
        """The rows trained on (train.long_conversations), and enough of them for train.steps."""
        self.rows = long_rows.fit(params, work.local)
        print(f"train: {long_rows.said(self.rows.summary, params['train']['max_target_length'])}", flush=True)
        train_data.check_enough_data(params, self.rows)

    def streams_from(self, params: dict, work: workdir.Workdir, step: int) -> list[str]:
        return train_data.streams_from(params, work, step, self.rows)

    def publish(self, params: dict, work: workdir.Workdir, final: str, out: str) -> None:
        """The final parameters (LoRA: the adapter, then merged into full parameters), in
        train.save_dtype."""
        full = os.path.join(out, "params")
        trained = os.path.join(out, "lora" if flags.lora_enabled(params) else "params")
        work.fetch(final, trained)
        if flags.lora_enabled(params):
            maxtext_process.run("train.merge", flags.merge_lora(params, trained, full), params)
        if params.train.save_dtype != "float32":
            maxtext_process.run("train.cast", flags.cast_params(params, full, full + ".cast"), params)
            shutil.rmtree(full)
            os.replace(full + ".cast", full)

    def after(self, params: dict, work: workdir.Workdir) -> None:
        """MaxText's trace (runtime.profile_steps) where a user looks: logs/profile/, never a DVC
        output; `xprof --logdir logs/profile` (or TensorBoard's profile plugin) opens it."""
        if params.runtime.profile_steps and work.fs.exists(work.profile):
            outputs.remove(PROFILE)
            work.fetch(work.profile, os.path.join(PROFILE, "plugins", "profile"))
            print(
                f"train: profile of {params['runtime']['profile_steps']} steps in {PROFILE}/ "
                f"(open it: xprof --logdir {PROFILE})",
                flush=True,
            )

    def summary(self, params: dict, done: list[dict]) -> dict:
        return self.rows.summary


if __name__ == "__main__":
    run(Train().main, "train")
