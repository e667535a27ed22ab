"""Launching MaxText's entry points: one child process each, offline, logged, watched.

A stage calls `run(...)`; the child is `python -m stages.lib.maxtext_main <module> ...`
(see there for why). Its full output goes to logs/<stage>.log; the terminal gets a short
progress line now and then, and on failure the last lines of the log.
"""

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from typing import Callable

import psutil

from stages.lib import gemma3, hardware
from stages.lib.cli import Interrupted, StageFailed, die_with_parent

LOG_DIR = "logs"
JAX_CACHE_DIR = os.path.join(".cache", "jax")
# Environment variables that may hold credentials. MaxText never needs them: every input it
# reads is a local file the pipeline already fetched, so they are withheld from its process.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ACCESS_TOKEN")


class MaxTextFailed(StageFailed):
    """MaxText exited non-zero; the message names the log and quotes its end."""

    def __init__(self, message: str, log_path: str):
        super().__init__(message)
        self.log_path = log_path


def child_env(params: dict) -> dict:
    # TPU_* come from the recipe (hardware.tpu_env), never from whatever the shell had set.
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV and not k.startswith("TPU_")}
    env.update(hardware.tpu_env(params))
    env.update(
        HF_HUB_OFFLINE="1",  # inputs are local; without these MaxText still makes DNS look-ups
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    if params["hardware"]["kind"] == "cpu":
        env.update(JAX_PLATFORMS="cpu", DECOUPLE_GCLOUD="TRUE")
    return env


def flag(value: bool) -> str:
    """A boolean as MaxText's command line spells it."""
    return str(value).lower()


def common_args(params: dict, base_hf_dir: str) -> list[str]:
    """Flags every entry point gets: the base checkpoint's architecture, hardware, caches."""
    args = gemma3.maxtext_model_args(base_hf_dir, params["model"]["maxtext_name"])
    args += [f"scan_layers={flag(params['model']['scan_layers'])}", f"jax_cache_dir={os.path.abspath(JAX_CACHE_DIR)}"]
    if params["hardware"]["kind"] == "cpu":
        args += ["hardware=cpu", "skip_jax_distributed_system=true"]
    return args


def lora_args(params: dict) -> list[str]:
    """MaxText's LoRA flags for train.lora (none when it is off)."""
    lora = params["train"]["lora"]
    if not lora["enabled"]:
        return []
    args = ["lora.enable_lora=true", f"lora.lora_rank={lora['rank']}", f"lora.lora_alpha={float(lora['alpha'])}"]
    return args + ([f"lora.lora_module_path={lora['module_path']}"] if lora["module_path"] else [])


def command(module: str, args: list[str], hf_config: str | None = None, hf_layout: str | None = None) -> list[str]:
    """The child's command line: MaxText's module under stages.lib.maxtext_main."""
    cmd = [sys.executable, "-m", "stages.lib.maxtext_main", module]
    if hf_config:
        cmd += ["--hf-config", hf_config]
    if hf_layout:
        cmd += ["--hf-layout", hf_layout]
    return cmd + ["--"] + args


def dry_run(stage: str, module: str, args: list[str], params: dict, hf_config: str | None = None,
            hf_layout: str | None = None) -> None:
    """Prints the exact command a stage would run and has MaxText validate its configuration."""
    print(f"{stage}: would run:\n  " + " \\\n    ".join(command(module, args, hf_config, hf_layout)), flush=True)
    check = [sys.executable, "-m", "stages.lib.maxtext_main", module, "--validate-only", "--", *args]
    # Validation only: on any machine, without touching an accelerator.
    proc = subprocess.run(check, env={**child_env(params), "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StageFailed(f"MaxText rejected the configuration:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    print(f"{stage}: {proc.stdout.strip().splitlines()[-1]}", flush=True)


def run(
    stage: str,
    module: str,
    args: list[str],
    params: dict,
    hf_config: str | None = None,
    hf_layout: str | None = None,
    progress: Callable[[], str | None] | None = None,
    progress_every: float = 2.0,
    extra_env: dict[str, str] | None = None,
) -> str:
    """Runs `python -m module args` with the checkpoint's HF config in MaxText's table.

    `progress` is polled while it runs; each new string it returns is printed. Returns the
    log path. Raises MaxTextFailed if MaxText exits non-zero.
    """
    os.makedirs(LOG_DIR, exist_ok=True)
    os.makedirs(JAX_CACHE_DIR, exist_ok=True)
    log_path = os.path.join(LOG_DIR, f"{stage}.log")
    cmd = command(module, args, hf_config, hf_layout)
    verbose = os.environ.get("PIPELINE_VERBOSE") == "1"
    print(f"{stage}: running {module} (log: {log_path})", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        child = subprocess.Popen(
            cmd, env={**child_env(params), **(extra_env or {})}, stdout=None if verbose else log, stderr=subprocess.STDOUT if not verbose else None,
            # If the stage is SIGKILLed, take MaxText down with it instead of leaving it training.
            preexec_fn=lambda: die_with_parent(signal.SIGKILL),
        )
        # Forward SIGTERM so `kill <stage>` stops MaxText too (SIGINT reaches it via the group).
        previous = signal.signal(signal.SIGTERM, lambda *_: signal_tree(signal.SIGTERM))
        try:
            last, last_at = None, 0.0
            while child.poll() is None:
                time.sleep(progress_every if progress else 1.0)
                line = progress() if progress else None
                if line and line != last and time.monotonic() - last_at >= progress_every:
                    print(f"{stage}: {line}", flush=True)
                    last, last_at = line, time.monotonic()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if child.poll() is None:
                child.kill()
                child.wait()
            stop_descendants()  # MaxText's data workers outlive a killed MaxText
    if child.returncode in (-signal.SIGTERM, -signal.SIGINT):
        raise Interrupted(f"{module} stopped by {signal.Signals(-child.returncode).name} after {time.monotonic() - started:.0f} s")
    if child.returncode != 0:
        tail = _tail(log_path, 25)
        raise MaxTextFailed(
            f"{module} failed (exit {child.returncode}) after {time.monotonic() - started:.0f} s. "
            f"Last lines of {log_path}:\n{tail}",
            log_path,
        )
    print(f"{stage}: {module} done in {time.monotonic() - started:.1f} s", flush=True)
    return log_path


def signal_tree(sig: int) -> None:
    """Sends sig to every descendant of this process (MaxText and the workers it started)."""
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def stop_descendants(grace_s: float = 5.0) -> None:
    """Stops and reaps whatever this process's children left behind (this process adopts
    orphans: cli.adopt_orphans)."""
    left = psutil.Process().children(recursive=True)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _tail(path: str, n: int) -> str:
    with open(path, errors="replace") as f:
        lines = collections.deque((ln.rstrip("\n")[-300:] for ln in f if ln.strip()), maxlen=n)
    return "\n".join("    " + ln for ln in lines)


def log_progress(log_path: str, label: str) -> Callable[[], str | None]:
    """A progress poller reporting the last tqdm percentage ("NN%|") MaxText wrote to its log."""

    def poll() -> str | None:
        try:
            with open(log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(log_path) - 4096))
                chunk = f.read().decode(errors="replace")
        except OSError:
            return None
        found = re.findall(r"(\d+)%\|", chunk)
        return f"{label} {found[-1]}%" if found else None

    return poll
