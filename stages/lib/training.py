"""The skeleton both training stages run (stages/train.py: SFT; stages/preference.py: DPO or
ORPO): a `TrainingStage` subclass states only what differs, its main() is this one.

    main()   params checked; the working directory (stages/lib/workdir.py) named by what is
             trained; --dry-run prints the job and has MaxText validate it; the accelerator
             and the disk checked; then, holding the directory's lock:
      prepare()       what the stage does before training (the rows' fit to the length, the step's fit)
      train()         MaxText until the final checkpoint exists, resumed from the newest one a
                      killed run left, its metrics logged through DVCLive as they are written
      publish()       the final parameters into the stage's DVC output (staged: whole or absent)
      summary()       the run's figures in dvclive*/metrics.json, the stage's own beside them
             and the working directory removed (unless runtime.keep_scratch).

The job itself (one process here, or one per host of a slice) is stages/lib/launch.py's; its
inputs (the stream, continued after a resume; a multi-host job's inputs on gs://) are
stages/lib/train_data.py's.
"""

import os
import sys

from stages.lib import hardware, launch, outputs, paths, train_data, train_metrics, workdir
from stages.lib.params import load
from stages.shared import checkpoint, families
from stages.shared.errors import StageFailed


class TrainingStage:
    name: str  # the stage: dvc.yaml's name, its messages' prefix, its working directory's
    section: str  # its params section: steps, num_epochs, checkpoint_period
    what: str  # in words, for messages ("training")
    run_name: str  # MaxText's run_name
    inputs: train_data.JobInputs  # what every host of its job reads besides its stream
    output: str  # the DVC output its final parameters are published into
    live_dir: str = train_metrics.LIVE_DIR
    train_keys: dict = train_metrics.TRAIN_KEYS  # MaxText's metrics logged per step

    # What differs between the stages.
    @staticmethod
    def build(params: dict, output_dir: str, metrics_file: str, train_file: str, staged=None):
        """MaxText's job (stages/lib/flags.py: train or preference)."""
        raise NotImplementedError

    def skipped(self, params: dict) -> bool:
        """Whether the stage has nothing to train (and has said so)."""
        return False

    def lora(self, params: dict) -> bool:
        return False

    def eval_interval(self, params: dict) -> int:
        """In-training held-out evaluations every N steps (0: none)."""
        return 0

    def prepare(self, params: dict, work: workdir.Workdir) -> None:
        """Before training, inside the lock."""

    def streams_from(self, params: dict, work: workdir.Workdir, step: int) -> list[str]:
        """The streams MaxText reads from `step` on (one per host)."""
        raise NotImplementedError

    def publish(self, params: dict, work: workdir.Workdir, final: str, out: str) -> None:
        """The final checkpoint's parameters (`final`, in the working directory) into `out`, the
        output's staging directory."""
        work.fetch(final, os.path.join(out, "params"))

    def summary(self, params: dict, done: list[dict]) -> dict:
        """The stage's own figures beside the run's (train_metrics.summary)."""
        return {}

    def after(self, params: dict, work: workdir.Workdir) -> None:
        """After publishing, before the working directory goes."""

    # The skeleton.
    def main(self) -> None:
        params = load()
        if self.skipped(params):
            return
        families.check_convertible(paths.BASE_HF, params["model"]["maxtext_name"])
        work = workdir.for_params(params, self.name, self.run_name)
        if "--dry-run" in sys.argv:
            streams = train_data.stream_names(params, work)
            job = train_data.invocation(self.build, params, work, streams, self.inputs, upload=False)
            launch.dry_run(self.name, job, params, work.name)
            return
        hardware.check_present(params)
        parameters = checkpoint.parameter_count(paths.BASE_HF)
        work.tidy(params["runtime"]["keep_checkpoints"])  # what a failed run left beyond what resuming needs
        present = 0 if work.on_gcs else len(work.complete_steps())
        hardware.check_training_disk(params, work.url, parameters, self.output, self.lora(params), present)
        with work.lock():
            self.prepare(params, work)
            print(f"{self.name}: working directory {work.url}", flush=True)
            work.restore(workdir.METRICS_FILE)
            for other in work.others():
                # Not deleted: going back to those params resumes it. Said, because on a 4B run
                # each holds tens of GB.
                print(
                    f"{self.name}: note: {other} is left from an interrupted run with other inputs; "
                    "delete it unless you will go back to those params",
                    flush=True,
                )
            curve = train_metrics.Curve(self.live_dir, self.train_keys)
            self.train(params, work, curve)
            with outputs.staged_dir(self.output) as tmp:
                self.publish(params, work, f"{work.checkpoints}/{params[self.section]['steps']}/model_params", tmp)
            self.after(params, work)
            interval = self.eval_interval(params)
            done = train_metrics.steps(work.metrics_file)
            evaluations = train_metrics.evals(work.metrics_file, interval)
            curve.add(done, evaluations)  # what the last poll did not see
            kind = params["hardware"]["kind"]
            curve.end({**train_metrics.summary(done, evaluations, kind), **self.summary(params, done)})
            if not params["runtime"]["keep_scratch"]:
                work.remove()
        print(f"{self.name}: wrote {self.output} and {self.live_dir}/", flush=True)

    def train(self, params: dict, work: workdir.Workdir, curve: train_metrics.Curve) -> None:
        """Runs MaxText until the final checkpoint exists (at once, if a killed run left it),
        logging its metrics to `curve` as it goes (a resumed run's begin with the killed one's)."""
        total, keep = params[self.section]["steps"], params["runtime"]["keep_checkpoints"]
        done = max([s for s in work.complete_steps() if s <= total], default=0)
        if done == total:
            print(f"{self.name}: the final checkpoint (step {done}) is already there; publishing it", flush=True)
            return
        interval = self.eval_interval(params)
        curve.add(train_metrics.steps(work.metrics_file), train_metrics.evals(work.metrics_file, interval), up_to=done)
        progress = train_metrics.reporter(work.metrics_file, total, interval, on_poll=work.keeper(keep), curve=curve)
        job = train_data.invocation(self.build, params, work, self.streams_from(params, work, done), self.inputs)
        checkpoint_gb = hardware.checkpoint_bytes(checkpoint.parameter_count(paths.BASE_HF), self.lora(params)) / 1e9
        full = (
            f"A checkpoint needs ~{checkpoint_gb:.2f} GB, {keep + 1} at once, in {work.url}: free that much (or move "
            "runtime.scratch_dir), then `dvc repro` resumes from the last whole checkpoint"
        )
        launch.run(
            self.name,
            job,
            params,
            work.name,
            progress,
            on_disk_full=full,
            finished=lambda: total in work.complete_steps(),
        )
        work.prune(keep)
        work.save(workdir.METRICS_FILE)
        if total not in work.complete_steps():
            logged = train_metrics.steps(work.metrics_file)
            s = self.section
            raise StageFailed(
                f"{self.what} stopped at step {int(logged[-1]['step']) if logged else 0} of {total} without a final "
                f"checkpoint; if the data ran out, raise {s}.num_epochs (now {params[s]['num_epochs']}) or lower "
                f"{s}.steps"
            )
