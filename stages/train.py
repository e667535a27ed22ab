"""Stage train: supervised fine-tuning with MaxText's SFT trainer (Tunix), on the local data.

    python -m stages.train             # run
    python -m stages.train --dry-run   # print the MaxText command, have MaxText validate it

Runs `maxtext.trainers.post_train.sft.train_sft` from models/base-maxtext/ on
data/chat/train.jsonl and writes
  models/sft-maxtext/   the final parameters (Orbax), input to convert_out
  metrics/train.json    final loss, tokens/s, step time (DVC metrics)
  plots/train.csv       loss, learning rate, grad norm, throughput per step (DVC plots)
MaxText's working directory (intermediate checkpoints every train.checkpoint_period steps)
is <runtime.scratch_dir>/train-<digest of this stage's inputs>, outside DVC's outputs; only
the newest runtime.keep_checkpoints of them are kept while training runs.
"""

import csv
import hashlib
import json
import os
import statistics
import sys
import time

import fsspec

from stages.lib import gemma3, hardware, maxtext, outputs
from stages.lib.cli import StageFailed, run
from stages.lib.params import load

BASE = os.path.join("models", "base-hf")
BASE_MAXTEXT = os.path.join("models", "base-maxtext", "0", "items")
DATA = os.path.join("data", "chat")
OUT = os.path.join("models", "sft-maxtext")
METRICS = os.path.join("metrics", "train.json")
PLOT = os.path.join("plots", "train.csv")
MODULE = "maxtext.trainers.post_train.sft.train_sft"
RUN_NAME = "sft"
TRACKED_SECTIONS = ("model", "train", "hardware")  # what this stage declares in dvc.yaml
# Per trained parameter in a checkpoint: float32 weights + Adam's two float32 moments.
CHECKPOINT_BYTES_PER_PARAM = 12


def inputs_digest(params: dict) -> str:
    """Identifies this stage's inputs: same digest = same run, so its scratch can be resumed."""
    h = hashlib.sha256(json.dumps({k: params[k] for k in TRACKED_SECTIONS}, sort_keys=True).encode())
    for root in (BASE_MAXTEXT, DATA, os.path.join(BASE, "config.json")):
        paths = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, files in os.walk(root) for f in files
        )
        for path in paths:
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
        """Steps with a finished checkpoint (Orbax renames a step's directory into place when done)."""
        if not self.fs.exists(self.checkpoints):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.checkpoints, detail=False))
        return sorted(int(n) for n in names if n.isdigit())

    def prune(self, keep: int) -> None:
        for step in self.complete_steps()[:-keep]:
            self.fs.rm(f"{self.checkpoints}/{step}", recursive=True)

    def remove(self) -> None:
        for path in {self.root, self.local}:
            if self.fs.exists(path) or os.path.exists(path):
                (self.fs if path == self.root else fsspec.filesystem("file")).rm(path, recursive=True)


def read_steps(metrics_file: str) -> list[dict]:
    """MaxText's per-step metrics (one JSON line per step; a resumed run appends)."""
    by_step = {}
    if os.path.exists(metrics_file):
        with open(metrics_file) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if "learning/loss" in row:
                    by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def progress_reporter(work: Workdir, total: int, keep: int):
    """Polled while MaxText runs: prunes old checkpoints, reports the newest step."""
    started = time.monotonic()

    def poll() -> str | None:
        work.prune(keep)
        steps = read_steps(work.metrics_file)
        if not steps:
            return f"compiling and starting ({time.monotonic() - started:.0f} s)"
        last = steps[-1]
        recent = [s["perf/step_time_seconds"] for s in steps[-10:] if s is not steps[0]] or [last["perf/step_time_seconds"]]
        per_step = statistics.mean(recent)
        eta = per_step * (total - int(last["step"]))
        return (f"step {int(last['step'])}/{total}  loss {last['learning/loss']:.4f}  "
                f"lr {last['learning/current_learning_rate']:.2e}  {per_step:.2f} s/step  ETA {eta / 60:.1f} min")

    return poll


def summarise(steps: list[dict]) -> dict:
    steady = steps[1:] or steps  # step 1 includes compilation
    return {
        "steps": int(steps[-1]["step"]),
        "final_loss": steps[-1]["learning/loss"],
        "first_step_loss": steps[0]["learning/loss"],
        "tokens_per_sec_per_device": statistics.median(s["perf/per_device_tokens_per_sec"] for s in steady),
        "step_time_s": statistics.median(s["perf/step_time_seconds"] for s in steady),
        "tflops_per_sec_per_device": statistics.median(s["perf/per_device_tflops_per_sec"] for s in steady),
    }


def write_plot(steps: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "learning_rate", "grad_norm", "tokens_per_sec_per_device", "step_time_s"])
        for s in steps:
            w.writerow([int(s["step"]), s["learning/loss"], s["learning/current_learning_rate"],
                        s.get("learning/grad_norm", ""), s["perf/per_device_tokens_per_sec"], s["perf/step_time_seconds"]])
    os.replace(tmp, path)


def maxtext_args(params: dict, work: Workdir) -> list[str]:
    t, m = params["train"], params["model"]
    flag = lambda b: str(b).lower()  # noqa: E731
    return maxtext.common_args(params, BASE) + [
        f"load_parameters_path={os.path.abspath(BASE_MAXTEXT)}",
        f"base_output_directory={work.url}",
        f"run_name={RUN_NAME}",
        f"tokenizer_path={os.path.abspath(BASE)}",
        "hf_path=json",
        f"hf_train_files={os.path.abspath(os.path.join(DATA, 'train.jsonl'))}",
        "train_split=train",
        "train_data_columns=['messages']",
        "eval_interval=-1",
        f"steps={t['steps']}",
        f"per_device_batch_size={t['per_device_batch_size']}",
        f"gradient_accumulation_steps={t['gradient_accumulation_steps']}",
        f"max_target_length={t['max_target_length']}",
        f"learning_rate={t['learning_rate']}",
        f"warmup_steps_fraction={t['warmup_steps_fraction']}",
        f"packing={flag(t['packing'])}",
        f"sft_train_on_completion_only={flag(t['completion_only_loss'])}",
        f"num_epoch={t['num_epochs']}",
        f"checkpoint_period={t['checkpoint_period']}",
        f"data_shuffle_seed={t['seed']}",
        f"init_weights_seed={t['seed']}",
        f"metrics_file={work.metrics_file}",
        f"checkpoint_storage_use_ocdbt={flag(m['checkpoint_ocdbt'])}",
        f"checkpoint_storage_use_zarr3={flag(m['checkpoint_zarr3'])}",
    ]


def check_disk(params: dict, work: Workdir) -> None:
    n = gemma3.parameter_count(BASE)
    keep = params["runtime"]["keep_checkpoints"]
    # The kept checkpoints plus the one being written.
    hardware.check_free_disk(work.url, (keep + 1) * CHECKPOINT_BYTES_PER_PARAM * n, "MaxText's training checkpoints")
    if not hardware.same_filesystem(work.url, OUT):
        hardware.check_output_disk(OUT, 4 * n, "the trained parameters")  # copied, not linked, across filesystems


def main() -> None:
    params = load()
    gemma3.check_convertible(BASE, params["model"]["maxtext_name"])
    work = Workdir(params)
    if "--dry-run" in sys.argv:
        maxtext.dry_run("train", MODULE, maxtext_args(params, work), params)
        return
    hardware.check_present(params)
    check_disk(params, work)
    steps_wanted, keep = params["train"]["steps"], params["runtime"]["keep_checkpoints"]
    os.makedirs(work.local, exist_ok=True)
    print(f"train: working directory {work.url}", flush=True)
    maxtext.run("train", MODULE, maxtext_args(params, work), params, progress=progress_reporter(work, steps_wanted, keep))
    work.prune(keep)

    steps = read_steps(work.metrics_file)
    if steps_wanted not in work.complete_steps():
        done = int(steps[-1]["step"]) if steps else 0
        raise StageFailed(
            f"training stopped at step {done} of {steps_wanted} without a final checkpoint; if the data ran out, "
            f"raise train.num_epochs (now {params['train']['num_epochs']}) or lower train.steps"
        )
    final = f"{work.checkpoints}/{steps_wanted}/model_params"
    with outputs.staged_dir(OUT) as tmp:
        if work.url.startswith("gs://"):
            work.fs.get(final + "/", tmp, recursive=True)
        else:
            outputs.link_or_copy_tree(final, tmp)
    outputs.write_json(METRICS, summarise(steps))
    write_plot(steps, PLOT)
    if not params["runtime"]["keep_scratch"]:
        work.remove()
    print(f"train: wrote {OUT}, {METRICS}, {PLOT}", flush=True)


if __name__ == "__main__":
    run(main, "train")
