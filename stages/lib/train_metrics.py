"""What MaxText reports while it trains, turned into progress lines and DVCLive's metrics.

MaxText's SFT trainer appends one JSON line per step to its `metrics_file`
(`learning/loss`, `learning/current_learning_rate`, `perf/step_time_seconds`, ...) and one
per evaluation (`eval/avg_loss`). A resumed run appends to the same file and repeats the
steps after its checkpoint; the repeated step replaces the killed run's line.

The train stage logs each line through DVCLive as MaxText writes it (`Curve`), so that
`dvc plots show`, `dvc exp show`, the VS Code extension and Studio show a run while it
runs: dvclive/plots/metrics/{train,eval}/<name>.tsv, one row per step, and
dvclive/metrics.json, the latest values and, at the end, the run's summary (`summary`).
"""

import json
import os
import statistics
import time

from stages.lib import hardware

LIVE_DIR = "dvclive"
SUMMARY = os.path.join(LIVE_DIR, "metrics.json")
PLOTS = os.path.join(LIVE_DIR, "plots", "metrics")
# DVCLive's name for each of MaxText's keys, per kind of line.
TRAIN_KEYS = {
    "loss": "learning/loss",
    "learning_rate": "learning/current_learning_rate",
    "grad_norm": "learning/grad_norm",
    "tokens_per_sec_per_device": "perf/per_device_tokens_per_sec",
    "step_time_s": "perf/step_time_seconds",
}
# eval/avg_loss is Tunix's: the mean over the held-out batches of each batch's loss (its
# cross-entropy per target token); eval/total_weights counts the target tokens.
EVAL_KEYS = {"loss": "eval/avg_loss", "perplexity": "eval/avg_perplexity", "target_tokens": "eval/total_weights"}


def read(metrics_file: str, key: str, start: int = 0) -> list[dict]:
    """The lines that carry `key`, from byte `start` on, one per step, in step order."""
    by_step = {}
    if os.path.exists(metrics_file):
        with open(metrics_file) as f:
            f.seek(start)
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if isinstance(row, dict) and key in row:
                    by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def steps(metrics_file: str, start: int = 0) -> list[dict]:
    return read(metrics_file, "learning/loss", start)


def evals(metrics_file: str, interval: int, start: int = 0) -> list[dict]:
    """The evaluations on the schedule, at step 0 and every `interval` steps. A resumed run
    also evaluates where it resumes (Tunix evaluates when training starts), which a run never
    interrupted would not: those are left out, so the curve is the uninterrupted run's."""
    return [r for r in read(metrics_file, "eval/avg_loss", start) if interval and int(r["step"]) % interval == 0]


def logged_evals(root: str = ".") -> dict[int, dict]:
    """The held-out evaluations a finished train stage logged through DVCLive (its cached
    output dvclive/plots), as {step: {"loss", "perplexity", "target_tokens"}}, each on the
    schedule (`evals`); empty where it evaluated nothing."""
    found: dict[int, dict] = {}
    for name in EVAL_KEYS:
        path = os.path.join(root, PLOTS, "eval", f"{name}.tsv")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            header = f.readline().rstrip("\n").split("\t")
            for line in f:
                row = dict(zip(header, line.rstrip("\n").split("\t"), strict=True))
                found.setdefault(int(row["step"]), {})[name] = float(row[name])
    return {step: values for step, values in found.items() if values.keys() == EVAL_KEYS.keys()}


def progress_line(done: list[dict], total: int) -> str:
    """`step 12/40  loss 8.0678  lr 8.89e-04  0.75 s/step  ETA 0.4 min` (step 1 compiles, so
    its time is left out of the rate once later steps exist)."""
    last = done[-1]
    recent = [s["perf/step_time_seconds"] for s in done[-10:] if s is not done[0]] or [last["perf/step_time_seconds"]]
    per_step = statistics.mean(recent)
    eta = per_step * (total - int(last["step"]))
    return (
        f"step {int(last['step'])}/{total}  loss {last['learning/loss']:.4f}  "
        f"lr {last['learning/current_learning_rate']:.2e}  {per_step:.2f} s/step  ETA {eta / 60:.1f} min"
    )


def summary(done: list[dict], evaluations: list[dict], hardware_kind: str) -> dict:
    """The run in a few numbers (dvclive/metrics.json's "run"): step 1, which compiles, is
    left out of the medians."""
    if not done:  # trained elsewhere, and its metrics lines were lost with that machine's disk
        return {
            "steps": None,
            "first_step_loss": None,
            "final_loss": None,
            "final_eval_loss": None,
            "median_tokens_per_sec_per_device": None,
            "median_step_time_s": None,
            "tflops_per_sec_per_device": None,
            "mfu": None,
        }
    steady = done[1:] or done
    tflops = statistics.median(s["perf/per_device_tflops_per_sec"] for s in steady)
    tpu = hardware.TPUS.get(hardware_kind)
    return {
        "steps": int(done[-1]["step"]),
        "first_step_loss": done[0]["learning/loss"],
        "final_loss": done[-1]["learning/loss"],
        "final_eval_loss": evaluations[-1]["eval/avg_loss"] if evaluations else None,
        "median_tokens_per_sec_per_device": statistics.median(s["perf/per_device_tokens_per_sec"] for s in steady),
        "median_step_time_s": statistics.median(s["perf/step_time_seconds"] for s in steady),
        "tflops_per_sec_per_device": tflops,
        # Model FLOPs utilisation: achieved over the chip's peak bf16 (no peak to compare on CPU).
        "mfu": tflops / tpu.peak_bf16_tflops_per_chip if tpu else None,
    }


class Curve:
    """MaxText's metrics lines logged through DVCLive, each step once, in step order."""

    def __init__(self, live_dir: str = LIVE_DIR, train_keys: dict[str, str] = TRAIN_KEYS):
        from dvclive import Live

        # resume=False: DVC removed the stage's outputs before running it; a resumed run
        # writes the curve again from the lines saved with its checkpoints (`add`), then
        # continues it. dvc.yaml declares these files itself (dvcyaml=None), and `dvc exp
        # run` makes the experiment (save_dvc_exp=False).
        self.live = Live(live_dir, resume=False, dvcyaml=None, save_dvc_exp=False)
        self.train_keys = train_keys
        self.logged: set[tuple[str, int]] = set()

    def add(self, done: list[dict], evaluations: list[dict], up_to: int | None = None) -> None:
        """Logs every line not logged yet (with `up_to`: only steps up to it)."""
        lines = [(int(r["step"]), "train", r, self.train_keys) for r in done] + [
            (int(r["step"]), "eval", r, EVAL_KEYS) for r in evaluations
        ]
        new = False
        for step, kind, row, keys in sorted(lines, key=lambda x: (x[0], x[1] == "train")):
            if (kind, step) in self.logged or (up_to is not None and step > up_to):
                continue
            self.live.step = step
            for name, key in keys.items():
                if key in row:
                    self.live.log_metric(f"{kind}/{name}", float(row[key]))
            self.logged.add((kind, step))
            new = True
        if new:
            self.live.make_summary()

    def end(self, run: dict) -> None:
        self.live.step = max((step for kind, step in self.logged if kind == "train"), default=0)
        self.live.summary["run"] = run
        self.live.make_summary()
        self.live.end()


def reporter(metrics_file: str, total: int, eval_interval: int, on_poll=None, curve: Curve | None = None):
    """A progress poller for maxtext_process.run: the newest step, or how long MaxText has been
    starting. `on_poll` runs first at every poll (the train stage prunes checkpoints); each
    new line goes to `curve`."""
    started = time.monotonic()
    this_run = os.path.getsize(metrics_file) if os.path.exists(metrics_file) else 0  # not a killed run's lines

    def poll() -> str:
        if on_poll:
            on_poll()
        done = steps(metrics_file, this_run)
        if curve:
            curve.add(done, evals(metrics_file, eval_interval, this_run))
        if not done:
            waited = time.monotonic() - started
            return f"starting: loading the model and compiling the train step ({waited // 30 * 30:.0f} s)"
        return progress_line(done, total)

    return poll
