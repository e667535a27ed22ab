"""The fit check's memory prediction against a TPU chip's own figure, for models bigger than
the recipe's: Gemma 3 1B and 4B (MaxText's `gemma3-1b` and `gemma3-4b`, random init,
synthetic data: memory and speed do not depend on the values), on one v5e chip (v5litepod-1).

    python -m bench.chip_memory predict OUT.json      # here, on CPU: the fit check's compile
    bench/chip_env.sh python -m bench.chip_memory measure OUT.json   # on the chip's machine

`predict` compiles each setting's train step ahead of time for v5e-1, as stages/fit_check.py
does (stages/lib/fit.py: MaxText's train_compile, XLA's memory analysis), and records the
per-chip total it predicts, or by how much it does not fit. `measure` runs the same step on
the chip for 20 steps through stages/in_maxtext/main.py (the stages' seam, which prints the
chip's peak memory) and records the peak, the step time (median after step 5), TFLOP/s and
MFU, or the chip's own out-of-memory figure when the compile there refuses it. Together they
are the table in docs/benchmarks.md, "On a TPU chip".
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stages.lib import fit, hardware, maxtext_process  # noqa: E402
from stages.lib.flags import AHEAD_OF_TIME_ENV, Invocation, config_file  # noqa: E402
from stages.shared import contract  # noqa: E402
from stages.shared.contract import TRAIN_COMPILE, TRAIN_SFT  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIND = "v5litepod-1"
LORA = ["lora.enable_lora=true", "lora.lora_rank=16", "lora.lora_alpha=32.0", "use_multimodal=false"]
# The chat rows and tokenizer the LoRA settings' SFT runs read (small-chat-v5e-1's, carried to the chip).
SFT_DATA = ["hf_path=json", "hf_train_files=data/chat/train.jsonl", "train_split=train"]
SFT_DATA += ["train_data_columns=['messages']", "tokenizer_path=models/base-hf", "grain_worker_count=0"]
# (name, MaxText model, weight dtype, per-device batch, tokens a row)
SETTINGS = [
    ("1B, float32 weights, batch 1", "gemma3-1b", "float32", 1, 1024),
    ("1B, bfloat16 weights, batch 4", "gemma3-1b", "bfloat16", 4, 1024),
    ("4B, float32 weights, batch 1 (the tutorial's row length)", "gemma3-4b", "float32", 1, 2048),
    ("4B, bfloat16 weights, batch 1", "gemma3-4b", "bfloat16", 1, 2048),
    # The small-chat-v5e-1 recipe's step (270M, float32 weights, batch 8, remat minimal) and what
    # MaxText offers beside it, for its MFU (issue 43's aim: 45%).
    ("270M, the recipe's step (batch 8, remat minimal)", "gemma3-270m", "float32", 8, 1024),
    ("270M, batch 8, no remat", "gemma3-270m", "float32", 8, 1024, ["remat_policy=none"]),
    ("270M, batch 16, remat minimal", "gemma3-270m", "float32", 16, 1024),
    (
        "270M, batch 8, remat minimal, attention dot_product",
        "gemma3-270m",
        "float32",
        8,
        1024,
        ["attention=dot_product"],
    ),
    (
        "270M, batch 12, remat minimal, attention dot_product",
        "gemma3-270m",
        "float32",
        12,
        1024,
        ["attention=dot_product"],
    ),
    # The tutorial's model on one v5e chip with LoRA (issue 57): MaxText's SFT trainer (Tunix, qwix
    # LoRA on the attention and MLP projections, rank 16) on real chat rows, the base frozen in
    # bfloat16; predicted by the fit check's LoRA-aware compile (stages/in_maxtext/main.py).
    ("4B LoRA, bfloat16 weights, batch 1 x 2048", "gemma3-4b", "bfloat16", 1, 2048, LORA),
    ("4B LoRA, bfloat16 weights, batch 2 x 2048", "gemma3-4b", "bfloat16", 2, 2048, LORA),
    ("4B LoRA, bfloat16 weights, batch 4 x 2048", "gemma3-4b", "bfloat16", 4, 2048, LORA),
]
PEAK = re.compile(r"^peak device memory: ([\d.]+) GiB", re.M)


# MaxText has no gemma3-1b: the 4B's model with Gemma 3 1B's dimensions (its config.json).
DIMENSIONS = {
    "gemma3-1b": ["model_name=gemma3-4b", "override_model_config=true", "base_emb_dim=1152", "base_mlp_dim=6912"]
    + ["base_num_decoder_layers=26", "base_num_query_heads=4", "base_num_kv_heads=1", "head_dim=256"]
    + ["sliding_window_size=512"],
    "gemma3-270m": ["model_name=gemma3-4b", "override_model_config=true", "base_emb_dim=640", "base_mlp_dim=2048"]
    + ["base_num_decoder_layers=18", "base_num_query_heads=4", "base_num_kv_heads=1", "head_dim=256"]
    + ["sliding_window_size=512", "vocab_size=262144"],
}


def flags(model: str, weight_dtype: str, batch: int, length: int, extra: list[str] | None = None) -> list[str]:
    extra = extra or []
    # MaxText's default remat (full), as the fit check compiles unless the recipe says otherwise;
    # the 270M recipe's own: minimal.
    remat = "minimal" if model == "gemma3-270m" else "full"
    return [
        *DIMENSIONS.get(model, [f"model_name={model}"]),
        f"weight_dtype={weight_dtype}",
        f"per_device_batch_size={batch}",
        f"max_target_length={length}",
        *([] if any(e.startswith("remat_policy=") for e in extra) else [f"remat_policy={remat}"]),
        "skip_jax_distributed_system=true",
        *extra,
    ]


def command(module: str, model: str, args: list[str]) -> list[str]:
    """The stages' own command for a MaxText entry point (stages/lib/maxtext_process.py), with
    base.yml, MaxText's pre-training config, which both train_compile and train read (SFT's own
    for its trainer); the compile of a LoRA setting gets the adapters as the fit check's does."""
    lora = "lora.enable_lora=true" in args
    setup = contract.Setup(
        model_name="gemma3-4b" if model in DIMENSIONS else model, lora_compile=lora and module == TRAIN_COMPILE
    )
    config = config_file(TRAIN_SFT if module == TRAIN_SFT else TRAIN_COMPILE)
    return maxtext_process.command(Invocation(module, [config, *args], setup))


def predict(name: str, model: str, weight_dtype: str, batch: int, length: int, extra=None) -> dict:
    with tempfile.TemporaryDirectory(prefix="chip-memory-") as work:
        args = flags(model, weight_dtype, batch, length, extra) + ["hardware=cpu", "compile_topology_num_slices=1"]
        args += [f"compile_topology={hardware.TPUS[KIND].topology}", f"base_output_directory={work}", "run_name=fit"]
        env = {**os.environ, **AHEAD_OF_TIME_ENV, "JAX_PLATFORMS": "cpu"}  # (as the fit check's)
        done = subprocess.run(command(TRAIN_COMPILE, model, args), cwd=ROOT, env=env, capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0 and not fit.finished_before_failing(text):
        try:
            fit.raise_if_out_of_memory(text)
        except fit.DoesNotFit as e:
            return {"fits": False, "why": str(e)}
        return {"error": text[-2000:]}
    total = fit.memory_analysis(text)["total"] / fit.GIB
    return {"fits": total <= hardware.TPUS[KIND].hbm_gib_per_chip, "predicted_gib": round(total, 2)}


def measure(name: str, model: str, weight_dtype: str, batch: int, length: int, extra=None) -> dict:
    with tempfile.TemporaryDirectory(prefix="chip-memory-") as work:
        metrics = os.path.join(work, "metrics.jsonl")
        args = flags(model, weight_dtype, batch, length, extra)
        sft = "lora.enable_lora=true" in args  # (LoRA: MaxText's SFT trainer, the only one that adds adapters)
        args += SFT_DATA if sft else ["dataset_type=synthetic"]
        args += ["steps=20", "enable_checkpointing=false", "learning_rate=1e-5"]
        if sft:  # where the step's time goes: three steps traced after the compile and warm-up
            args += ["profiler=xplane", "skip_first_n_steps_for_profiler=8", "profiler_steps=3"]
        args += [f"base_output_directory={work}", "run_name=chip", f"metrics_file={metrics}"]
        env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
        cmd = command(TRAIN_SFT if sft else "maxtext.trainers.pre_train.train", model, args)
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
        text = done.stdout + done.stderr
        steps = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
        ops = top_ops(work)
    oom = fit.OOM.search(text)
    if oom:  # (the chip's compile refused it, in the words the fit check reads: what it needed)
        needed = float(oom.group(2)) * fit.UNIT[oom.group(3)] / fit.GIB
        return {"fits": False, "chip_needed_gib": round(needed, 2), "line": oom.group(0)}
    if done.returncode != 0 or not steps:
        return {"error": text[-3000:]}
    later = [s for s in steps if s.get("step", 0) >= 5] or steps
    step_s = statistics.median(s["perf/step_time_seconds"] for s in later)
    tflops = statistics.median(s["perf/per_device_tflops_per_sec"] for s in later)
    peak = PEAK.search(text)
    return {
        "fits": True,
        "peak_gib": float(peak.group(1)) if peak else None,
        "step_s": round(step_s, 4),
        "tokens_per_s": round(batch * length / step_s),
        "tflops_per_s": round(tflops, 1),
        "mfu_percent": round(100 * tflops / hardware.TPUS[KIND].peak_bf16_tflops_per_chip, 1),
        "first_step_s": round(steps[0]["perf/step_time_seconds"], 1),
        **({"top_ops_ms_per_step": ops} if ops else {}),
    }


def top_ops(work: str, steps: int = 3, n: int = 15) -> dict:
    """The profile's ops on the chip by time a step (ms), the longest first: from the Chrome
    trace the profiler writes beside its xplane (events on the TPU's own op line)."""
    import gzip
    from collections import Counter

    found = sorted(os.path.join(d, f) for d, _, fs in os.walk(work) for f in fs if f.endswith(".trace.json.gz"))
    if not found:
        return {}
    with gzip.open(found[-1]) as f:
        trace = json.load(f)
    devices = {e["pid"] for e in trace.get("traceEvents", []) if e.get("ph") == "M" and "TPU:0" in str(e.get("args"))}
    total: Counter = Counter()
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("pid") in devices and "dur" in e:
            total[e["name"]] += e["dur"] / 1000.0
    return {name: round(ms / steps, 2) for name, ms in total.most_common(n)}


def main() -> None:
    what, out = sys.argv[1], sys.argv[2]
    run = {"predict": predict, "measure": measure}[what]
    only = sys.argv[3:]  # names' first words, e.g. "1B,"
    results = json.load(open(out)) if os.path.exists(out) else {}
    for setting in SETTINGS:
        if only and not any(setting[0].startswith(o) for o in only):
            continue
        print(f"chip_memory: {what}: {setting[0]}", flush=True)
        results[setting[0]] = run(*setting)
        print(f"chip_memory: {json.dumps(results[setting[0]])[:400]}", flush=True)
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
