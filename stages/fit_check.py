"""Stage fit_check: does the training configuration fit the TPU's memory? Answered without one.

    python -m stages.fit_check                                  # the recipe as it is
    python -m stages.fit_check --search per_device_batch_size   # the largest batch that fits
    python -m stages.fit_check --search max_target_length       # the longest rows that fit

Compiles the train step for the recipe's topology (`hardware.kind`, e.g. v6e-8) with
MaxText's ahead-of-time compiler (`maxtext.trainers.pre_train.train_compile`) and libtpu, on
whatever machine it runs on: a CPU box will do (gemma3-4b: ~4 min, ~6 GB RAM). XLA's memory
analysis gives, per chip, the arguments (parameters and optimizer state), temporaries and
code; metrics/fit_check.json records them with the share of HBM and the headroom. A
configuration that would not fit fails here, saying by how much, instead of on the TPU.
As a DVC stage it runs before `train`. It compiles MaxText's pre-training step, which has the
same model, optimizer and batch shapes as the SFT step: a close proxy for fit, not an exact one.
CPU recipes have nothing to compile; the stage records that and passes.
"""

import argparse
import os
import re
import tempfile

from stages.lib import hardware, maxtext, outputs, paths
from stages.lib.cli import StageFailed, UserError, run
from stages.lib.params import load

BASE = paths.BASE_HF
METRICS = os.path.join("metrics", "fit_check.json")
MODULE = "maxtext.trainers.pre_train.train_compile"
GIB = 1024**3
STATS = re.compile(r"(\w+)_size_in_bytes=(\d+)")
# XLA's compile-time out-of-memory error, e.g. "Ran out of memory on HBM, the total memory
# required for HLO temporaries (117.68G) exceeds available HBM (31.24G)".
OOM = re.compile(r"required for ([\w ]+?) \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class DoesNotFit(StageFailed):
    pass


def compile_args(params: dict, workdir: str, overrides: dict) -> list[str]:
    t = {**params["train"], **overrides}
    topology = hardware.TPUS[params["hardware"]["kind"]].topology
    return maxtext.common_args(params, BASE) + [
        f"compile_topology={topology}",
        "compile_topology_num_slices=1",
        f"base_output_directory={workdir}",
        "run_name=fit_check",
        f"per_device_batch_size={t['per_device_batch_size']}",
        f"gradient_accumulation_steps={t['gradient_accumulation_steps']}",
        f"max_target_length={t['max_target_length']}",
        "skip_jax_distributed_system=true",
    ]


def raise_if_out_of_memory(log_text: str) -> None:
    """XLA's compile-time out-of-memory error, as DoesNotFit saying by how much."""
    oom = OOM.search(log_text)
    if oom:
        what, needed, available = oom.group(1), float(oom.group(2)) * UNIT[oom.group(3)], float(oom.group(4)) * UNIT[oom.group(5)]
        raise DoesNotFit(f"its {what} alone need {needed / GIB:.1f} GiB per chip, over the chip's HBM "
                         f"({available / GIB:.1f} GiB) by {(needed - available) / GIB:.1f} GiB")
    if "RESOURCE_EXHAUSTED" in log_text:
        line = next(ln for ln in log_text.splitlines() if "RESOURCE_EXHAUSTED" in ln)
        raise DoesNotFit(line.split("RESOURCE_EXHAUSTED:", 1)[1].strip()[:300])


def parse(log_text: str, hbm_bytes: float) -> dict:
    """Per-chip memory from a successful compile's log."""
    line = next((ln for ln in log_text.splitlines() if ln.startswith("Memory analysis:")), None)
    if line is None:
        raise StageFailed("the compile finished without a memory analysis")
    s = {k: int(v) for k, v in STATS.findall(line)}
    total = s["argument"] + s["output"] + s["temp"] - s["alias"] + s["generated_code"]
    report = {
        "fits": total <= hbm_bytes,
        "per_chip_gib": {"arguments": s["argument"] / GIB, "temporaries": s["temp"] / GIB,
                        "code": s["generated_code"] / GIB, "total": total / GIB},
        "hbm_gib": hbm_bytes / GIB,
        "hbm_used_percent": 100 * total / hbm_bytes,
        "headroom_gib": (hbm_bytes - total) / GIB,
    }
    if not report["fits"]:
        raise DoesNotFit(f"needs {total / GIB:.1f} GiB per chip, over the chip's HBM by {(total - hbm_bytes) / GIB:.1f} GiB")
    return report


def compile_once(params: dict, overrides: dict | None = None) -> dict:
    kind = params["hardware"]["kind"]
    hbm = hardware.TPUS[kind].hbm_gib_per_chip * GIB
    with tempfile.TemporaryDirectory(prefix="fit_check-") as workdir:
        # Compiling for a TPU topology needs libtpu, not a TPU: run on the host's CPU.
        cpu = {**params, "hardware": {"kind": "cpu", "tpu_env": None}}
        # No TPU is used, so do not take libtpu's single-process lock: the check must work
        # beside a training run holding the TPU (or a test process that loaded libtpu).
        env = {"TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
        try:
            log = maxtext.run("fit_check", MODULE, compile_args(params, workdir, overrides or {}), cpu, extra_env=env)
        except maxtext.MaxTextFailed as e:
            with open(e.log_path, errors="replace") as f:
                raise_if_out_of_memory(f.read())
            raise
        with open(log, errors="replace") as f:
            return parse(f.read(), hbm)


def search(params: dict, key: str) -> None:
    """The largest train.<key> that fits: double until it does not, then bisect."""
    quantum = 1 if key == "per_device_batch_size" else 256  # sequence lengths in whole blocks
    fits_at, fails_at, value = 0, None, params["train"][key]
    while True:
        try:
            report = compile_once(params, {key: value})
            print(f"fit_check: {key}={value} fits ({report['hbm_used_percent']:.0f}% of HBM)", flush=True)
            fits_at = value
        except DoesNotFit as e:
            print(f"fit_check: {key}={value} does not fit ({e})", flush=True)
            fails_at = value
        if fails_at is None:
            value *= 2
            continue
        value = (fits_at + fails_at) // 2 // quantum * quantum
        if value <= fits_at:
            break
    if fits_at == 0:
        raise DoesNotFit(f"no {key} fits, not even {fails_at}")
    print(f"fit_check: the largest {key} that fits is {fits_at}: set train.{key}: {fits_at} in params.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.fit_check")
    parser.add_argument("--search", choices=["per_device_batch_size", "max_target_length"])
    args = parser.parse_args()
    params = load()
    kind = params["hardware"]["kind"]
    if kind == "cpu":
        if args.search:
            raise UserError("hardware.kind is cpu: there is no accelerator memory to search")
        outputs.write_json(METRICS, {"applicable": False, "reason": "hardware.kind is cpu"})
        print("fit_check: hardware.kind is cpu, nothing to compile", flush=True)
        return
    if args.search:
        search(params, args.search)
        return
    try:
        report = compile_once(params)
    except DoesNotFit as e:
        raise DoesNotFit(
            f"train.per_device_batch_size={params['train']['per_device_batch_size']}, max_target_length="
            f"{params['train']['max_target_length']} does not fit a {kind}: {e}. Find what does: "
            "python -m stages.fit_check --search per_device_batch_size"
        ) from None
    outputs.write_json(METRICS, {"applicable": True, "hardware": kind, **report})
    g = report["per_chip_gib"]
    print(f"fit_check: fits a {kind}: {g['total']:.1f} of {report['hbm_gib']:.0f} GiB per chip "
          f"({report['hbm_used_percent']:.0f}%: arguments {g['arguments']:.1f}, temporaries {g['temporaries']:.1f}, "
          f"code {g['code']:.2f}); headroom {report['headroom_gib']:.1f} GiB", flush=True)


if __name__ == "__main__":
    run(main, "fit_check")
