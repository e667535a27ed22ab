"""Stage train: supervised fine-tuning with MaxText's SFT trainer (Tunix), on the local data.

    python -m stages.train

Runs `maxtext.trainers.post_train.sft.train_sft` from models/base-maxtext/ on
data/chat/train.jsonl and writes
  models/sft-maxtext/   the final parameters (Orbax), input to convert_out
  metrics/train.json    final loss, tokens/s, step time (DVC metrics)
  plots/train.csv       loss, learning rate, grad norm, throughput per step (DVC plots)
MaxText's working directory (intermediate checkpoints, its own metrics) lives in
<runtime.scratch_dir>/train-<digest of this stage's inputs>, outside DVC's outputs.
"""

import csv
import hashlib
import json
import os
import statistics
import time

from stages.lib import maxtext, outputs
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


def progress_reporter(metrics_file: str, total: int):
    started = time.monotonic()

    def poll() -> str | None:
        steps = read_steps(metrics_file)
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


def maxtext_args(params: dict, workdir: str) -> list[str]:
    t, m = params["train"], params["model"]
    flag = lambda b: str(b).lower()  # noqa: E731
    return maxtext.common_args(params, BASE) + [
        f"load_parameters_path={os.path.abspath(BASE_MAXTEXT)}",
        f"base_output_directory={workdir}",
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
        f"metrics_file={os.path.join(workdir, 'metrics.jsonl')}",
        f"checkpoint_storage_use_ocdbt={flag(m['checkpoint_ocdbt'])}",
        f"checkpoint_storage_use_zarr3={flag(m['checkpoint_zarr3'])}",
    ]


def main() -> None:
    params = load()
    steps_wanted = params["train"]["steps"]
    workdir = os.path.abspath(os.path.join(params["runtime"]["scratch_dir"], f"train-{inputs_digest(params)}"))
    os.makedirs(workdir, exist_ok=True)
    metrics_file = os.path.join(workdir, "metrics.jsonl")
    print(f"train: working directory {workdir}", flush=True)
    maxtext.run("train", MODULE, maxtext_args(params, workdir), params,
                progress=progress_reporter(metrics_file, steps_wanted))

    steps = read_steps(metrics_file)
    final = os.path.join(workdir, RUN_NAME, "checkpoints", str(steps_wanted), "model_params")
    if not os.path.isdir(final):
        done = int(steps[-1]["step"]) if steps else 0
        raise StageFailed(
            f"training stopped at step {done} of {steps_wanted} without a final checkpoint; if the data ran out, "
            f"raise train.num_epochs (now {params['train']['num_epochs']}) or lower train.steps"
        )
    with outputs.staged_dir(OUT) as tmp:
        outputs.link_or_copy_tree(final, tmp)
    outputs.write_json(METRICS, summarise(steps))
    write_plot(steps, PLOT)
    if not params["runtime"]["keep_scratch"]:
        outputs.remove(workdir)
    print(f"train: wrote {OUT}, {METRICS}, {PLOT}", flush=True)


if __name__ == "__main__":
    run(main, "train")
