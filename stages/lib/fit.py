"""Does a training step fit the TPU's memory? MaxText's ahead-of-time compile of the step for the
recipe's topology, with libtpu, on whatever machine runs it (no TPU needed), and XLA's memory
analysis of it: what stages/fit_check.py checks the recipe with, and the preference stage its
own step (stages/preference.py).
"""

import re
import tempfile

from stages.lib import flags, hardware, maxtext_process
from stages.shared.errors import StageFailed

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


def memory_analysis(log_text: str) -> dict[str, int] | None:
    """XLA's memory analysis of a compile (bytes by kind, and `total`: what a chip holds while
    the step runs), or None when the log has none."""
    line = next((ln for ln in log_text.splitlines() if ln.startswith("Memory analysis:")), None)
    if line is None:
        return None
    s = {k: int(v) for k, v in STATS.findall(line)}
    return {**s, "total": s["argument"] + s["output"] + s["temp"] - s["alias"] + s["generated_code"]}


def parse(log_text: str, hbm_bytes: float) -> dict:
    """Per-chip memory from a successful compile's log."""
    s = memory_analysis(log_text)
    if s is None:
        raise StageFailed("the compile finished without a memory analysis")
    total = s["total"]
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
