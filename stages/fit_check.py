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

from stages.lib import flags, hardware, maxtext_process, outputs
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared.errors import StageFailed, UserError

METRICS = os.path.join("metrics", "fit_check.json")
GIB = 1024**3
STATS = re.compile(r"(\w+)_size_in_bytes=(\d+)")
# XLA's compile-time out-of-memory error, e.g. "Ran out of memory on HBM, the total memory
# required for HLO temporaries (117.68G) exceeds available HBM (31.24G)".
OOM = re.compile(r"required for ([\w ]+?) \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class DoesNotFit(StageFailed):
    pass


# MaxText's last words after a successful ahead-of-time compile (train_compile.py).
COMPILED = "Finished train_compile.py successfully!"


def finished_before_failing(log_text: str) -> bool:
    """Whether a compile that exited non-zero had finished, memory analysis and all, first.
    libtpu, loaded for the compile, watches the interpreter's exit and kills a slow one
    ("exit() hanging: killing process with SIGTRAP"), seen on a busy 2-core machine: the
    figures printed before that are whole."""
    return COMPILED in log_text and any(ln.startswith("Memory analysis:") for ln in log_text.splitlines())


def raise_if_out_of_memory(log_text: str) -> None:
    """XLA's compile-time out-of-memory error, as DoesNotFit saying by how much."""
    oom = OOM.search(log_text)
    if oom:
        what, needed, available = (
            oom.group(1),
            float(oom.group(2)) * UNIT[oom.group(3)],
            float(oom.group(4)) * UNIT[oom.group(5)],
        )
        raise DoesNotFit(
            f"its {what} alone need {needed / GIB:.1f} GiB per chip, over the chip's HBM "
            f"({available / GIB:.1f} GiB) by {(needed - available) / GIB:.1f} GiB"
        )
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
        "per_chip_gib": {
            "arguments": s["argument"] / GIB,
            "temporaries": s["temp"] / GIB,
            "code": s["generated_code"] / GIB,
            "total": total / GIB,
        },
        "hbm_gib": hbm_bytes / GIB,
        "hbm_used_percent": 100 * total / hbm_bytes,
        "headroom_gib": (hbm_bytes - total) / GIB,
    }
    if not report["fits"]:
        raise DoesNotFit(
            f"needs {total / GIB:.1f} GiB per chip, over the chip's HBM by {(total - hbm_bytes) / GIB:.1f} GiB"
        )
    return report


def compile_once(params: dict, overrides: dict | None = None) -> dict:
    hbm = hardware.TPUS[params["hardware"]["kind"]].hbm_gib_per_chip * GIB
    with tempfile.TemporaryDirectory(prefix="fit_check-") as workdir:
        # Compiling for a TPU topology needs libtpu, not a TPU: MaxText runs on the host's CPU.
        cpu = flags.placed_on_cpu(params)
        try:
            log = maxtext_process.run("fit_check", flags.fit_check(params, workdir, overrides or {}), cpu)
        except maxtext_process.MaxTextFailed as e:
            with open(e.log_path, errors="replace") as f:
                text = f.read()
            if not finished_before_failing(text):
                raise_if_out_of_memory(text)
                raise
            print(
                "fit_check: the compile finished; its process was killed on the way out (libtpu's exit "
                f"watchdog), which changes none of its figures (log: {e.log_path})",
                flush=True,
            )
            log = e.log_path
        with open(log, errors="replace") as f:
            return parse(f.read(), hbm)


def largest_fitting(start: int, quantum: int, fits) -> tuple[int, int | None]:
    """(largest value that fits, smallest that does not) for a monotone `fits(value)`:
    double from `start` until it does not fit, then bisect in steps of `quantum`."""
    fits_at, fails_at, value = 0, None, start
    while True:
        if fits(value):
            fits_at = value
        else:
            fails_at = value
        if fails_at is None:
            value *= 2
            continue
        value = (fits_at + fails_at) // 2 // quantum * quantum
        if value <= fits_at:
            return fits_at, fails_at


def search(params: dict, key: str) -> None:
    """The largest train.<key> that fits, each probe one real compile."""

    def fits(value: int) -> bool:
        try:
            report = compile_once(params, {key: value})
        except DoesNotFit as e:
            print(f"fit_check: {key}={value} does not fit ({e})", flush=True)
            return False
        print(f"fit_check: {key}={value} fits ({report['hbm_used_percent']:.0f}% of HBM)", flush=True)
        return True

    quantum = 1 if key == "per_device_batch_size" else 256  # sequence lengths in whole blocks
    fits_at, fails_at = largest_fitting(params["train"][key], quantum, fits)
    if fits_at == 0:
        raise DoesNotFit(f"no {key} fits, not even {fails_at}")
    print(f"fit_check: the largest {key} that fits is {fits_at}: set train.{key}: {fits_at} in params.yaml")


def does_not_fit(params: dict, why: DoesNotFit) -> DoesNotFit:
    """The stage's one line for a recipe that would not fit: what, by how much, what next."""
    t = params["train"]
    return DoesNotFit(
        f"train.per_device_batch_size={t['per_device_batch_size']}, max_target_length={t['max_target_length']} "
        f"does not fit a {params['hardware']['kind']}: {why}. Find what does: "
        "python -m stages.fit_check --search per_device_batch_size"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.fit_check")
    parser.add_argument("--search", choices=["per_device_batch_size", "max_target_length"])
    args = parser.parse_args()
    params = load()
    kind = params["hardware"]["kind"]
    if kind == "cpu":
        if args.search:
            raise UserError("hardware.kind is cpu: there is no accelerator memory to search")
        outputs.write_json(METRICS, {"fit": {"applicable": False, "reason": "hardware.kind is cpu"}})
        print("fit_check: hardware.kind is cpu, nothing to compile", flush=True)
        return
    if args.search:
        search(params, args.search)
        return
    try:
        report = compile_once(params)
    except DoesNotFit as e:
        raise does_not_fit(params, e) from None
    outputs.write_json(
        METRICS, {"fit": {"applicable": True, "hardware": kind, **report}}
    )  # fit.* in `dvc metrics show`
    g = report["per_chip_gib"]
    print(
        f"fit_check: fits a {kind}: {g['total']:.1f} of {report['hbm_gib']:.0f} GiB per chip "
        f"({report['hbm_used_percent']:.0f}%: arguments {g['arguments']:.1f}, temporaries {g['temporaries']:.1f}, "
        f"code {g['code']:.2f}); headroom {report['headroom_gib']:.1f} GiB",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "fit_check")
