"""The machine: the accelerators a recipe can name, and the checks a stage runs in its first
second (is the accelerator here, is there disk for what the stage will write).

A recipe's `hardware.kind` says where it runs. On the wrong machine every stage stops before
downloading or converting anything, with one line that says what is missing and what to run
instead; on the right one, MaxText gets the TPU runtime environment from the recipe's
`hardware.tpu_env` (what the Cloud TPU tutorials export by hand), not from the user's shell.
"""

import glob
import os
import shutil
from dataclasses import dataclass

from stages.shared.errors import UserError


@dataclass(frozen=True)
class Accelerator:
    chips: int
    hosts: int  # VMs of the slice, each running one process of the training job
    hbm_gib_per_chip: float  # for the fit check's headroom
    peak_bf16_tflops_per_chip: float  # for MFU
    topology: str  # what MaxText's ahead-of-time compile takes as compile_topology

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts


# Cloud TPU slices: v6e-8 is one VM of 8 chips (the tutorial's ct6e-standard-8t); larger v6e
# slices are VMs of 4 chips; a v5p VM has 4 chips (v5p-N counts TensorCores, two per chip).
# Add a row to support another kind (single-host kinds also need their tpu_env values).
TPUS = {
    "v6e-8": Accelerator(chips=8, hosts=1, hbm_gib_per_chip=32, peak_bf16_tflops_per_chip=918, topology="v6e-8"),
    "v6e-16": Accelerator(chips=16, hosts=4, hbm_gib_per_chip=32, peak_bf16_tflops_per_chip=918, topology="v6e-16"),
    "v6e-32": Accelerator(chips=32, hosts=8, hbm_gib_per_chip=32, peak_bf16_tflops_per_chip=918, topology="v6e-32"),
    "v6e-64": Accelerator(chips=64, hosts=16, hbm_gib_per_chip=32, peak_bf16_tflops_per_chip=918, topology="v6e-64"),
    # Cloud TPU v5e ("v5litepod"): single-host VMs of 1, 4 or 8 chips; 197 bf16 TFLOP/s and 16 GB of
    # HBM a chip, of which the runtime lets a program use 15.75 GiB (JAX's bytes_limit, measured on a
    # v5e chip: docs/benchmarks.md, "On a TPU chip").
    "v5litepod-1": Accelerator(
        chips=1, hosts=1, hbm_gib_per_chip=15.75, peak_bf16_tflops_per_chip=197, topology="v5e-1"
    ),
    "v5litepod-4": Accelerator(
        chips=4, hosts=1, hbm_gib_per_chip=15.75, peak_bf16_tflops_per_chip=197, topology="v5e-4"
    ),
    "v5litepod-8": Accelerator(
        chips=8, hosts=1, hbm_gib_per_chip=15.75, peak_bf16_tflops_per_chip=197, topology="v5e-8"
    ),
    "v5p-16": Accelerator(chips=8, hosts=2, hbm_gib_per_chip=95, peak_bf16_tflops_per_chip=459, topology="v5p-16"),
    "v5p-32": Accelerator(chips=16, hosts=4, hbm_gib_per_chip=95, peak_bf16_tflops_per_chip=459, topology="v5p-32"),
}
KINDS = ("cpu", *TPUS)
TPU_ENV_KEYS = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_ID",
    "TPU_NAME",
    "TPU_SKIP_MDS_QUERY",
    "TPU_WORKER_HOSTNAMES",
    "TPU_TOPOLOGY",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_HOST_BOUNDS",
)
TINY_HINT = "to run the pipeline on this machine's CPU use the tiny recipe: python -m tools.recipe tiny && dvc repro"


def on_cpu(params: dict) -> bool:
    """Whether the recipe runs on this machine's CPU (hardware.kind cpu) rather than a TPU: the
    one test of it, for the flags (hardware=cpu), MaxText's environment (JAX_PLATFORMS) and the
    launcher (processes of a CPU job)."""
    return params["hardware"]["kind"] == "cpu"


def devices_per_host(params: dict) -> int:
    """Accelerator devices each host (each process of the job) drives: a TPU host's chips, or
    the one CPU device of each process of a CPU run."""
    tpu = TPUS.get(params["hardware"]["kind"])
    return tpu.chips_per_host if tpu else 1


def hosts(params: dict) -> int:
    """Processes of the training job: one per TPU host, or hardware.hosts on a CPU."""
    return params["hardware"]["hosts"]


def tpu_chips_present() -> int:
    """TPU chips this VM exposes: /dev/accel* (v4, v5e) or /dev/vfio/<n> (v5p, v6e)."""
    return len(glob.glob("/dev/accel*")) or len([p for p in glob.glob("/dev/vfio/*") if os.path.basename(p).isdigit()])


def check_present(params: dict) -> None:
    """Fails at once when the recipe's accelerator is not on this machine."""
    kind = params["hardware"]["kind"]
    if on_cpu(params) or not params["runtime"]["check_hardware"] or params["runtime"]["launcher"] == "xpk":
        return  # (with xpk the TPUs are the GKE cluster's, not this machine's)
    want, have = TPUS[kind].chips_per_host, tpu_chips_present()
    if have == 0:
        raise UserError(
            f"hardware.kind is {kind} but this machine has no TPU (no /dev/accel* or /dev/vfio/*); {TINY_HINT}"
        )
    if have < want:
        raise UserError(f"hardware.kind is {kind} ({want} chips) but this machine has {have}; use a {kind} VM")


def tpu_env(params: dict) -> dict[str, str]:
    """The TPU runtime variables for MaxText's process (empty for CPU recipes)."""
    return dict(params["hardware"]["tpu_env"] or {})


def _existing(path: str) -> str:
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return probe


# What a stage that met a full disk ends its one line with (its own writes: stages/lib/cli.py;
# MaxText's: stages/lib/maxtext_process.py, where a stage may say more).
FULL_DISK_ADVICE = (
    "Free some space there (or move runtime.scratch_dir, or the DVC cache: `dvc cache dir`), then `dvc repro`"
)


def free_bytes(path: str) -> int:
    """Free space on the filesystem that holds (or will hold) a local path."""
    return shutil.disk_usage(_existing(path)).free


def writing_on_full_disk(path: str | None) -> str:
    """ " writing PATH (N GB free there now)", the part of a full-disk line that names where ("" for no path)."""
    return f" writing {path} ({free_bytes(path) / 1e9:.2f} GB free there now)" if path else ""


def same_filesystem(a: str, b: str) -> bool:
    """Whether two local paths (existing or not yet) are on one filesystem (hard links work)."""
    return (
        not (a.startswith("gs://") or b.startswith("gs://"))
        and os.stat(_existing(a)).st_dev == os.stat(_existing(b)).st_dev
    )


def check_free_disk(path: str, need_bytes: float, what: str) -> None:
    """Fails when the filesystem holding `path` has less than `need_bytes` free."""
    if path.startswith("gs://"):
        return
    probe = _existing(path)
    free = free_bytes(probe)
    if free < need_bytes:
        raise UserError(
            f"not enough free disk for {what} in {probe}: needs ~{need_bytes / 1e9:.1f} GB, "
            f"{free / 1e9:.1f} GB free; free some space, or move it (runtime.scratch_dir, `dvc cache dir`)"
        )


def dvc_cache_dir() -> str:
    """The DVC cache directory as configured (.dvc/config.local over .dvc/config)."""
    import configparser

    for name in ("config.local", "config"):
        config = configparser.ConfigParser()
        config.read(os.path.join(".dvc", name))
        if config.has_option("cache", "dir"):
            return os.path.normpath(os.path.join(".dvc", config.get("cache", "dir").strip('"')))
    return os.path.join(".dvc", "cache")


def check_output_disk(out_path: str, need_bytes: float, what: str) -> None:
    """Room for an output in the workspace and, when the DVC cache is on another filesystem
    (then outputs are copied into it, not linked), in the cache too."""
    check_free_disk(out_path, need_bytes, what)
    if not same_filesystem(dvc_cache_dir(), out_path):
        check_free_disk(dvc_cache_dir(), need_bytes, f"{what} (DVC cache copy)")


# Per trained parameter in a checkpoint: float32 weights + Adam's two float32 moments. A LoRA
# checkpoint holds only the adapter: a few percent of the model at any sensible rank.
CHECKPOINT_BYTES_PER_PARAM = 12
LORA_CHECKPOINT_FRACTION = 0.05


def checkpoint_bytes(n_params: int, lora: bool) -> float:
    """One training checkpoint of a model of n_params (the train stage's disk check, tools.plan)."""
    return CHECKPOINT_BYTES_PER_PARAM * n_params * (LORA_CHECKPOINT_FRACTION if lora else 1)


def check_training_disk(
    params: dict, work_url: str, n_params: int, trained_out: str, lora: bool, present: int = 0
) -> None:
    """Disk for the train stage: the kept checkpoints plus the one being written, in MaxText's
    working directory, less the `present` ones a resumed run already holds there, and the
    final float32 params in `trained_out` unless they can be linked."""
    keep = params["runtime"]["keep_checkpoints"]
    per_checkpoint = checkpoint_bytes(n_params, lora)
    to_write = keep + 1 - min(present, keep)
    check_free_disk(work_url, to_write * per_checkpoint, "MaxText's training checkpoints")
    if not same_filesystem(work_url, trained_out):
        check_output_disk(trained_out, 4 * n_params, "the trained parameters")  # copied, not linked
