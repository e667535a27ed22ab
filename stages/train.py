"""Stage train: supervised fine-tuning with MaxText's SFT trainer (Tunix), on the local data.

    python -m stages.train             # run
    python -m stages.train --dry-run   # print the MaxText command, have MaxText validate it

Runs `maxtext.trainers.post_train.sft.train_sft` from models/base-maxtext/ on
data/chat/train.jsonl and writes
  models/sft-maxtext/   params/: the final full parameters (Orbax), input to convert_out;
                        lora/: with train.lora.enabled, the adapter, merged into params/
                        by stages/lib/merge_lora.py
  metrics/train.json    final loss, tokens/s, step time, MFU (DVC metrics)
  plots/train.csv       loss, learning rate, grad norm, throughput per step (DVC plots)
  plots/eval.csv        held-out loss every train.eval_interval steps (DVC plots)
MaxText's working directory (intermediate checkpoints every train.checkpoint_period steps)
is <runtime.scratch_dir>/train-<digest of this stage's inputs>, outside DVC's outputs; only
the newest runtime.keep_checkpoints of them are kept while training runs.

Resuming: a run that was killed leaves its working directory; the next `dvc repro` with the
same inputs finds it by the digest, and MaxText restores the newest complete checkpoint
(a changed param or input means another digest: a fresh start). MaxText's SFT input
pipeline would restart from the first conversation, so the stage owns the data order: it
writes the shuffled stream MaxText reads (MaxText's own shuffling is off) and, on resume,
starts it after the conversations the finished steps consumed (stages/lib/data_position.py).
"""

import csv
import fcntl
import hashlib
import importlib.metadata
import io
import json
import os
import statistics
import sys
import time

import fsspec
import numpy as np

from stages.lib import chat, gemma3, hardware, maxtext, outputs, paths
from stages.lib.cli import StageFailed, run
from stages.lib.params import load

BASE = paths.BASE_HF
BASE_MAXTEXT = paths.BASE_MAXTEXT_PARAMS
OUT = paths.SFT_MAXTEXT
METRICS = os.path.join("metrics", "train.json")
PLOT = os.path.join("plots", "train.csv")
EVAL_PLOT = os.path.join("plots", "eval.csv")
MODULE = "maxtext.trainers.post_train.sft.train_sft"
RUN_NAME = "sft"
TRACKED_SECTIONS = ("model", "train", "hardware")  # what this stage declares in dvc.yaml
# Per trained parameter in a checkpoint: float32 weights + Adam's two float32 moments. A LoRA
# checkpoint holds only the adapter: a few percent of the model at any sensible rank.
CHECKPOINT_BYTES_PER_PARAM = 12
LORA_CHECKPOINT_FRACTION = 0.05


def inputs_digest(params: dict) -> str:
    """Identifies this stage's inputs: same digest = same run, so its scratch can be resumed.
    (The trainer's version too: another MaxText must not resume this one's checkpoints.)"""
    trainer = {pkg: importlib.metadata.version(pkg) for pkg in ("maxtext", "google-tunix")}
    h = hashlib.sha256(json.dumps({"trainer": trainer, **{k: params[k] for k in TRACKED_SECTIONS}}, sort_keys=True).encode())
    for root in (BASE_MAXTEXT, paths.DATA, os.path.join(BASE, "config.json")):
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, name) for d, _, names in os.walk(root) for name in names
        )
        for path in files:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


class Workdir:
    """MaxText's working directory for one set of inputs, local or on gs://.

    MaxText writes checkpoints under `url`; its per-step metrics file must be local, so it
    lives in `local` (the same directory unless the scratch is on GCS).
    """

    def __init__(self, params: dict):
        name = f"train-{inputs_digest(params)}"
        scratch = params["runtime"]["scratch_dir"]
        self.url = f"{scratch.rstrip('/')}/{name}" if scratch.startswith("gs://") else os.path.abspath(os.path.join(scratch, name))
        self.local = self.url if not scratch.startswith("gs://") else os.path.abspath(os.path.join(".scratch", name))
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.checkpoints = f"{self.root}/{RUN_NAME}/checkpoints"
        self.metrics_file = os.path.join(self.local, "metrics.jsonl")

    def complete_steps(self) -> list[int]:
        """Steps with a finished checkpoint. Locally Orbax renames a step's directory into place
        when it is done; on GCS, which cannot rename atomically, the directory has its final
        name from the start and a commit_success.txt in it says it is done."""
        if not self.fs.exists(self.checkpoints):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.checkpoints, detail=False))
        steps = sorted(int(n) for n in names if n.isdigit())
        if self.url.startswith("gs://"):
            steps = [s for s in steps if self.fs.exists(f"{self.checkpoints}/{s}/commit_success.txt")]
        return steps

    def prune(self, keep: int) -> None:
        for step in self.complete_steps()[:-keep]:
            self.fs.rm(f"{self.checkpoints}/{step}", recursive=True)

    def lock(self):
        """Holds the directory for this process; a second training on the same inputs (say, an
        orphan of a killed `dvc repro`) is refused instead of corrupting the checkpoints."""
        os.makedirs(self.local, exist_ok=True)
        handle = open(os.path.join(self.local, ".lock"), "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StageFailed(f"another training run is using {self.url}; wait for it to end, or stop it") from None
        return handle

    def others(self) -> list[str]:
        """Working directories of runs with other inputs (killed, then params changed)."""
        parent = self.url.rsplit("/", 1)[0]
        fs, root = fsspec.core.url_to_fs(parent)
        mine = self.root.rstrip("/").rsplit("/", 1)[-1]
        return [p for p in (fs.glob(f"{root}/train-*") if fs.exists(root) else []) if not p.endswith(mine)]

    def remove(self) -> None:
        for path in {self.root, self.local}:
            if self.fs.exists(path) or os.path.exists(path):
                (self.fs if path == self.root else fsspec.filesystem("file")).rm(path, recursive=True)


def read_metrics(metrics_file: str, key: str, start: int = 0) -> list[dict]:
    """MaxText's metrics lines that carry `key`, from byte `start` on (one per step; a resumed
    run appends, and a step it repeats replaces the killed run's)."""
    by_step = {}
    if os.path.exists(metrics_file):
        with open(metrics_file) as f:
            f.seek(start)
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if key in row:
                    by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def read_steps(metrics_file: str, start: int = 0) -> list[dict]:
    return read_metrics(metrics_file, "learning/loss", start)


def read_evals(metrics_file: str) -> list[dict]:
    return read_metrics(metrics_file, "eval/avg_loss")


def progress_reporter(work: Workdir, total: int, keep: int):
    """Polled while MaxText runs: prunes old checkpoints, reports the newest step."""
    started = time.monotonic()
    this_run = os.path.getsize(work.metrics_file) if os.path.exists(work.metrics_file) else 0  # not a killed run's lines

    def poll() -> str | None:
        work.prune(keep)
        steps = read_steps(work.metrics_file, this_run)
        if not steps:
            return f"compiling and starting ({time.monotonic() - started:.0f} s)"
        last = steps[-1]
        recent = [s["perf/step_time_seconds"] for s in steps[-10:] if s is not steps[0]] or [last["perf/step_time_seconds"]]
        per_step = statistics.mean(recent)
        eta = per_step * (total - int(last["step"]))
        return (f"step {int(last['step'])}/{total}  loss {last['learning/loss']:.4f}  "
                f"lr {last['learning/current_learning_rate']:.2e}  {per_step:.2f} s/step  ETA {eta / 60:.1f} min")

    return poll


def summarise(steps: list[dict], evals: list[dict], params: dict) -> dict:
    steady = steps[1:] or steps  # step 1 includes compilation
    tflops = statistics.median(s["perf/per_device_tflops_per_sec"] for s in steady)
    tpu = hardware.TPUS.get(params["hardware"]["kind"])
    return {
        "steps": int(steps[-1]["step"]),
        "final_loss": steps[-1]["learning/loss"],
        "first_step_loss": steps[0]["learning/loss"],
        "final_eval_loss": evals[-1]["eval/avg_loss"] if evals else None,
        "tokens_per_sec_per_device": statistics.median(s["perf/per_device_tokens_per_sec"] for s in steady),
        "step_time_s": statistics.median(s["perf/step_time_seconds"] for s in steady),
        "tflops_per_sec_per_device": tflops,
        # Model FLOPs utilisation: achieved over the chip's peak bf16 (no peak to compare on CPU).
        "mfu": tflops / tpu.peak_bf16_tflops_per_chip if tpu else None,
    }


def write_csv(path: str, header: list[str], rows: list[list]) -> None:
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(header)
    w.writerows(rows)
    outputs.write_text(path, text.getvalue())


def write_plots(steps: list[dict], evals: list[dict]) -> None:
    write_csv(PLOT, ["step", "loss", "learning_rate", "grad_norm", "tokens_per_sec_per_device", "step_time_s"],
              [[int(s["step"]), s["learning/loss"], s["learning/current_learning_rate"], s.get("learning/grad_norm", ""),
                s["perf/per_device_tokens_per_sec"], s["perf/step_time_seconds"]] for s in steps])
    write_csv(EVAL_PLOT, ["step", "eval_loss", "eval_perplexity"],
              [[int(e["step"]), e["eval/avg_loss"], e["eval/avg_perplexity"]] for e in evals])


def write_stream(params: dict, work: Workdir) -> str:
    """The order MaxText trains in: the training rows shuffled with train.seed, once per epoch
    (each epoch its own permutation), as one file. Written once per working directory."""
    path = os.path.join(work.local, "stream.jsonl")
    if not os.path.exists(path):
        with open(os.path.join(paths.DATA, "train.jsonl")) as f:
            rows = [line for line in f if line.strip()]
        tmp = f"{path}.tmp-{os.getpid()}"  # streamed, not outputs.write_text: it can be GBs
        with open(tmp, "w") as f:
            for epoch in range(params["train"]["num_epochs"]):
                for i in np.random.RandomState(params["train"]["seed"] + epoch).permutation(len(rows)):
                    f.write(rows[i])
        os.replace(tmp, path)
    return path


def resume_stream(params: dict, work: Workdir, stream: str, step: int) -> str:
    """The stream after the rows the first `step` steps trained on, replayed on CPU through
    MaxText's own pipeline (stages/lib/data_position.py)."""
    report = os.path.join(work.local, f"position-{step}.json")
    cpu = {**params, "hardware": {"kind": "cpu", "tpu_env": None}}
    tpu = hardware.TPUS.get(params["hardware"]["kind"])
    maxtext.run("train.data_position", "stages.lib.data_position",
                ["--steps", str(step), "--report", report, "--"] + maxtext_args(cpu, work, stream),
                cpu, extra_env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={tpu.chips if tpu else 1}"})
    with open(report) as f:
        consumed = json.load(f)["rows"]
    path = os.path.join(work.local, f"stream-from-step-{step}.jsonl")
    with open(stream) as src, open(path, "w") as dst:
        dst.writelines(line for i, line in enumerate(src) if i >= consumed)
    print(f"train: resuming at step {step}: the data stream continues after the {consumed} conversations "
          "those steps trained on", flush=True)
    return path


def maxtext_args(params: dict, work: Workdir, train_file: str) -> list[str]:
    t, m = params["train"], params["model"]
    return maxtext.common_args(params, BASE) + chat.maxtext_data_args(params, train_file) + [
        f"load_parameters_path={os.path.abspath(BASE_MAXTEXT)}",
        f"base_output_directory={work.url}",
        f"run_name={RUN_NAME}",
        f"eval_interval={t['eval_interval'] or -1}",
        "eval_steps=-1",  # each evaluation covers the whole eval split
        f"steps={t['steps']}",
        f"per_device_batch_size={t['per_device_batch_size']}",
        f"gradient_accumulation_steps={t['gradient_accumulation_steps']}",
        f"learning_rate={t['learning_rate']}",
        f"warmup_steps_fraction={t['warmup_steps_fraction']}",
        "enable_data_shuffling=false",  # the stream is already shuffled (write_stream) ...
        "num_epoch=1",  # ... and holds every epoch
        f"checkpoint_period={t['checkpoint_period']}",
        f"init_weights_seed={t['seed']}",
        f"metrics_file={work.metrics_file}",
        f"checkpoint_storage_use_ocdbt={maxtext.flag(m['checkpoint_ocdbt'])}",
        f"checkpoint_storage_use_zarr3={maxtext.flag(m['checkpoint_zarr3'])}",
    ] + maxtext.lora_args(params)


def check_disk(params: dict, work: Workdir) -> None:
    n = gemma3.parameter_count(BASE)
    keep = params["runtime"]["keep_checkpoints"]
    per_checkpoint = CHECKPOINT_BYTES_PER_PARAM * n * (LORA_CHECKPOINT_FRACTION if params["train"]["lora"]["enabled"] else 1)
    # The kept checkpoints plus the one being written.
    hardware.check_free_disk(work.url, (keep + 1) * per_checkpoint, "MaxText's training checkpoints")
    if not hardware.same_filesystem(work.url, OUT):
        hardware.check_output_disk(OUT, 4 * n, "the trained parameters")  # copied, not linked, across filesystems


def main() -> None:
    params = load()
    gemma3.check_convertible(BASE, params["model"]["maxtext_name"])
    work = Workdir(params)
    if "--dry-run" in sys.argv:
        maxtext.dry_run("train", MODULE, maxtext_args(params, work, os.path.join(work.local, "stream.jsonl")), params)
        return
    hardware.check_present(params)
    check_disk(params, work)
    max_length = params["train"]["max_target_length"]
    too_long, total = chat.count_too_long(os.path.join(paths.DATA, "train.jsonl"), BASE, max_length)
    if too_long:
        print(f"train: {too_long} of {total} training conversations are longer than train.max_target_length="
              f"{max_length} tokens; MaxText truncates them, so their ends are never trained on", flush=True)
    steps_wanted, keep = params["train"]["steps"], params["runtime"]["keep_checkpoints"]
    lock = work.lock()  # noqa: F841 - held until the stage exits
    print(f"train: working directory {work.url}", flush=True)
    for other in work.others():
        # Not deleted: going back to those params resumes it. Said, because on a 4B run each
        # holds tens of GB.
        print(f"train: note: {other} is left from an interrupted run with other inputs; "
              "delete it unless you will go back to those params", flush=True)
    stream = write_stream(params, work)
    done = max([s for s in work.complete_steps() if s <= steps_wanted], default=0)
    if done == steps_wanted:
        print(f"train: the final checkpoint (step {done}) is already there; publishing it", flush=True)
    else:
        train_file = resume_stream(params, work, stream, done) if done else stream
        maxtext.run("train", MODULE, maxtext_args(params, work, train_file), params,
                    progress=progress_reporter(work, steps_wanted, keep))
    work.prune(keep)

    steps = read_steps(work.metrics_file)
    if steps_wanted not in work.complete_steps():
        done = int(steps[-1]["step"]) if steps else 0
        raise StageFailed(
            f"training stopped at step {done} of {steps_wanted} without a final checkpoint; if the data ran out, "
            f"raise train.num_epochs (now {params['train']['num_epochs']}) or lower train.steps"
        )
    final = f"{work.checkpoints}/{steps_wanted}/model_params"
    lora = params["train"]["lora"]
    with outputs.staged_dir(OUT) as tmp:
        trained = os.path.join(tmp, "lora" if lora["enabled"] else "params")
        if work.url.startswith("gs://"):
            work.fs.get(final + "/", trained, recursive=True)
        else:
            outputs.link_or_copy_tree(final, trained)
        if lora["enabled"]:
            maxtext.run("train.merge", "stages.lib.merge_lora", [
                "--base", os.path.abspath(BASE_MAXTEXT), "--adapter", os.path.abspath(trained),
                "--scale", str(lora["alpha"] / lora["rank"]), "--out", os.path.abspath(os.path.join(tmp, "params")),
            ], params)
    evals = read_evals(work.metrics_file)
    outputs.write_json(METRICS, {**summarise(steps, evals, params), "conversations_truncated": too_long})
    write_plots(steps, evals)
    if not params["runtime"]["keep_scratch"]:
        work.remove()
    print(f"train: wrote {OUT}, {METRICS}, {PLOT}, {EVAL_PLOT}", flush=True)


if __name__ == "__main__":
    run(main, "train")
