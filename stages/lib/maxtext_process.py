"""Launching MaxText's entry points: one child process each, offline, logged, watched.

A stage builds an `Invocation` (stages/lib/flags.py) and calls `run(stage, invocation,
params)`; the child is `python -m stages.in_maxtext.main <module> ...` (see there for why).
Its full output goes to logs/<stage>.log; the terminal gets a short progress line now and
then, and on failure the last lines of the log.
"""

import collections
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from stages.lib import hardware
from stages.lib.cli import die_with_parent
from stages.lib.flags import Invocation
from stages.shared import contract
from stages.shared.errors import Interrupted, StageFailed

LOG_DIR = "logs"
# Environment variables that may hold credentials. MaxText never needs them: every input it
# reads is a local file the pipeline already fetched, so they are withheld from its process.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ACCESS_TOKEN")


class MaxTextFailed(StageFailed):
    """MaxText exited non-zero; the message names the log and quotes its end."""

    def __init__(self, message: str, log_path: str):
        super().__init__(message)
        self.log_path = log_path


# glibc's malloc hands every block over 32 MB to the kernel (mmap) and gives it back when it
# is freed (munmap), so the arrays XLA allocates anew for each step (weights, gradients,
# optimizer state) are faulted in again 4 KB at a time, a large share of a training's CPU
# time spent in the kernel. This tunable has glibc ask for transparent huge pages (2 MB) for
# its blocks instead (glibc >= 2.35; older ones ignore it): far fewer faults, less CPU time
# (python -m bench.malloc; docs/benchmarks.md, row 16). Nothing computed changes.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"


def malloc_tunables(current: str | None) -> str:
    """GLIBC_TUNABLES for MaxText's process: the machine's own, plus huge pages for malloc
    unless they already say otherwise (GLIBC_TUNABLES=glibc.malloc.hugetlb=0 turns it off)."""
    if current and HUGE_PAGES_TUNABLE in current:
        return current
    return ":".join(filter(None, [current, f"{HUGE_PAGES_TUNABLE}=1"]))


def job_env(params: dict) -> dict[str, str]:
    """What MaxText's process is given on top of its machine's environment: the recipe's TPU
    settings, offline mode (inputs are local; without these MaxText still makes DNS
    look-ups), the CPU platform, huge pages for malloc. A remote worker gets exactly these
    (stages/lib/launch.py)."""
    env = dict(hardware.tpu_env(params))
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        GLIBC_TUNABLES=malloc_tunables(os.environ.get("GLIBC_TUNABLES")),
    )
    if hardware.on_cpu(params):
        env.update(JAX_PLATFORMS="cpu", DECOUPLE_GCLOUD="TRUE")
    return env


def child_env(params: dict) -> dict[str, str]:
    """This machine's environment for MaxText's process, less credentials; TPU_* come from the
    recipe (hardware.tpu_env), never from whatever the shell had set."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV and not k.startswith("TPU_")}
    return {**env, **job_env(params)}


def command(invocation: Invocation) -> list[str]:
    """The child's command line: its module under stages.in_maxtext.main, the Setup and our
    module's request as JSON (stages/shared/contract.py), then MaxText's flags."""
    cmd = [sys.executable, "-m", contract.ENTRY, invocation.module, "--setup", contract.encode(invocation.setup)]
    if invocation.request is not None:
        cmd += ["--request", contract.encode(invocation.request)]
    return cmd + ["--"] + invocation.args


def dry_run(stage: str, invocation: Invocation, params: dict, plan: str | None = None) -> None:
    """Prints the exact command a stage would run (or `plan`: a job's, stages/lib/launch.py)
    and has MaxText validate its configuration."""
    print(
        f"{stage}: " + (plan or "would run:\n  " + " \\\n    ".join(map(shlex.quote, command(invocation)))), flush=True
    )
    check = [*command(invocation)[: command(invocation).index("--")], "--validate-only", "--", *invocation.args]
    # Validation only: on any machine, without touching an accelerator.
    proc = subprocess.run(
        check, env={**child_env(params), **invocation.env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise StageFailed(f"MaxText rejected the configuration:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    print(f"{stage}: {proc.stdout.strip().splitlines()[-1]}", flush=True)


@dataclass(frozen=True)
class Worker:
    """One process of a job: the command that starts it here (MaxText itself, or `gcloud ...
    ssh` that runs MaxText on a TPU worker), its environment, and its log."""

    name: str  # "worker 1 of 2", for messages
    command: list[str]
    env: dict[str, str]
    log_path: str


def oom_counters(pid: int | str = "self") -> list[str]:
    """The files in which the kernel counts the processes its out-of-memory killer ended in the
    process's memory cgroup (cgroup v1's memory.oom_control, v2's memory.events: any OOM kill,
    a cgroup's limit or the whole machine's), or /proc/vmstat's machine-wide count where the
    process's cgroup cannot be read."""
    files = []
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "memory":
                    files.append(f"/sys/fs/cgroup/memory{path}/memory.oom_control")
                elif controllers == "":
                    files += [f"/sys/fs/cgroup{path}/memory.events", f"/sys/fs/cgroup/unified{path}/memory.events"]
    except (OSError, ValueError):
        pass
    return [f for f in files if os.path.exists(f)] or ["/proc/vmstat"]


def oom_kills(counter: str) -> int:
    """The count in one of oom_counters' files (0 where it cannot be read)."""
    try:
        with open(counter) as f:
            return next((int(line.split()[1]) for line in f if line.startswith("oom_kill ")), 0)
    except (OSError, ValueError):
        return 0


def memory_advice(stage: str, params: dict) -> str:
    """What lowers the memory the stage's MaxText process needs, with the values it ran with:
    the sentence an out-of-memory kill ends with."""
    section = stage.split(".")[0]
    if stage == "train":
        t = params["train"]
        advice = (
            f"lower train.per_device_batch_size (now {t['per_device_batch_size']}) or train.max_target_length "
            f"(now {t['max_target_length']}): a new run"
        )
        if t["remat_policy"] != "full":  # (stages/lib/workdir.py: remat is not part of what is trained)
            advice = (
                f"set train.remat_policy: full (now {t['remat_policy']}): the run resumes from its last "
                f"checkpoint; or {advice}"
            )
        return advice + ", then `dvc repro`"
    if section == "preference":
        p = params["preference"]
        return (
            f"lower preference.per_device_batch_size (now {p['per_device_batch_size']}) or "
            f"preference.max_target_length (now {p['max_target_length']}), then `dvc repro`"
        )
    return "stop what else uses memory, or run it on a machine with more, then `dvc repro`"


# A full disk as a process reports it: strerror(ENOSPC), quoted by Python's OSError and by
# tensorstore (Orbax's checkpoints), each on a line that names the file.
NO_SPACE = "No space left on device"
NO_SPACE_BYTES = NO_SPACE.encode()
ABSOLUTE_PATH = re.compile(r"(?:(?<=[\"'= ])|^)(/[^\s'\":\]]+)")  # (not a key's "a/0.0.0")


class DiskFullWatch:
    """Reads a worker's log as it grows and keeps its last line that says the disk was full.

    The whole log, not its end: a process that fails a checkpoint save on a full disk can
    print hundreds of kilobytes after the error as it shuts down (measured: 390 KB of
    "Exception ignored ... Python is likely shutting down" from Orbax's threads after the
    final save's ENOSPC, MaxText 0.2.5). Each check reads only what was added since the last."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.offset = 0
        self.unfinished = b""  # the log's last line, until its newline is written
        self.line: str | None = None

    def check(self) -> tuple[bool, str | None]:
        """Whether the log says the disk was full, and the path its last such line names, if any."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                while chunk := f.read(1 << 20):
                    self.offset += len(chunk)
                    *lines, self.unfinished = (self.unfinished + chunk).split(b"\n")
                    found = next((ln for ln in reversed(lines) if NO_SPACE_BYTES in ln), None)
                    self.line = found.decode(errors="replace") if found is not None else self.line
        except OSError:
            pass
        line = self.unfinished.decode(errors="replace") if NO_SPACE_BYTES in self.unfinished else self.line
        if line is None:
            return False, None
        found = ABSOLUTE_PATH.findall(line)
        return True, (found[0] if found else None)


def output_directory(command: list[str]) -> str | None:
    """Where the MaxText process writes (its base_output_directory, when on this machine): what
    a full-disk line names when the error itself names no file, as when the disk fills between
    two checkpoints and the append of a metrics line fails (`OSError: [Errno 28] No space left
    on device`, no path)."""
    found = next((a.split("=", 1)[1] for a in command if a.startswith("base_output_directory=")), None)
    return found if found and "://" not in found else None


def disk_full(module: str, elapsed: float, path: str | None, advice: str) -> str:
    """The one line for a MaxText process that stopped on a full disk."""
    return f"{module} ran out of disk space after {elapsed:.0f} s{hardware.writing_on_full_disk(path)}. {advice}"


def run(
    stage: str,
    invocation: Invocation,
    params: dict,
    progress: Callable[[], str | None] | None = None,
    progress_every: float = 2.0,
    on_disk_full: str = hardware.FULL_DISK_ADVICE,
    finished: Callable[[], bool] | None = None,
) -> str:
    """Runs the invocation as one child process of this machine and waits for it.

    `progress` is polled every `progress_every` seconds while it runs; a string it returns
    is printed when it differs from the last one printed. Returns the log path. Raises
    MaxTextFailed if the child exits non-zero, Interrupted if a signal stopped it.
    `finished`: whether the work is done (run_workers).
    """
    log_path = os.path.join(LOG_DIR, f"{stage}.log")
    worker = Worker("MaxText", command(invocation), {**child_env(params), **invocation.env}, log_path)
    run_workers(
        stage,
        invocation.module,
        [worker],
        progress,
        progress_every,
        memory_advice(stage, params),
        on_disk_full,
        finished,
    )
    return log_path


def run_workers(
    stage: str,
    module: str,
    workers: list[Worker],
    progress: Callable[[], str | None] | None = None,
    progress_every: float = 2.0,
    on_oom: str | None = None,
    on_disk_full: str = hardware.FULL_DISK_ADVICE,
    finished: Callable[[], bool] | None = None,
) -> None:
    """Runs the workers of one job side by side and waits for all of them. The first to fail
    stops the others at once (in a multi-controller job they would wait forever for it) and
    the error names it. A worker the kernel's out-of-memory killer ended is said in one line
    with its peak memory, and `on_oom`: what to change; one that stopped on a full disk, with the
    path and `on_disk_full`. `finished` (training: the final checkpoint is there) tells a kill
    read as a clean exit: in one run of the suite the kernel's OOM killer ended MaxText (the
    kernel's log named it) and its exit still read as 0; with the work unfinished and a kill
    counted, it is said as a kill for memory."""
    os.makedirs(LOG_DIR, exist_ok=True)
    verbose = os.environ.get("PIPELINE_VERBOSE") == "1"
    logs = ", ".join(w.log_path for w in workers)
    print(
        f"{stage}: running {module}" + (f" on {len(workers)} workers" if len(workers) > 1 else "") + f" (log: {logs})",
        flush=True,
    )
    started = time.monotonic()
    # Each counter the children are counted in, as it stood before they could be killed: the
    # stage's own cgroup now, a child's when first seen (a child may have moved to another).
    oom_before = {c: oom_kills(c) for c in oom_counters()}
    children, peaks = [], {}
    disk_watches = {w.log_path: DiskFullWatch(w.log_path) for w in workers}
    with contextlib.ExitStack() as files:
        for worker in workers:
            log = files.enter_context(open(worker.log_path, "w"))
            log.write(" ".join(worker.command) + "\n\n")
            log.flush()
            children.append(
                subprocess.Popen(
                    worker.command,
                    env=worker.env,
                    stdout=None if verbose else log,
                    stderr=None if verbose else subprocess.STDOUT,
                    # If the stage is SIGKILLed, take MaxText down with it instead of leaving it training.
                    preexec_fn=lambda: die_with_parent(signal.SIGKILL),
                )
            )
        # Forward SIGTERM so `kill <stage>` stops MaxText too (SIGINT reaches it via the group).
        previous = signal.signal(signal.SIGTERM, lambda *_: signal_tree(signal.SIGTERM))
        failed = None
        try:
            last = None
            while failed is None and any(c.poll() is None for c in children):
                try:  # returns the moment the child exits: no stage idles after MaxText is done
                    next(c for c in children if c.poll() is None).wait(timeout=progress_every)
                except subprocess.TimeoutExpired:
                    pass
                for child in children:  # (the last reading before a kill: the kernel's victim leaves none)
                    peaks[child.pid] = max(peaks.get(child.pid, 0), high_water_mark(child.pid))
                    for counter in oom_counters(child.pid) if child.poll() is None else []:
                        oom_before.setdefault(counter, oom_kills(counter))
                failed = next((w for w, c in zip(workers, children, strict=True) if c.poll() not in (None, 0)), None)
                # A full disk under an asynchronous checkpoint save does not end MaxText: the
                # save's thread fails and the train loop waits on it forever (measured,
                # MaxText 0.2.5). Its log says so; stop it then (below: its children killed).
                if failed is None and (full := next((w for w in workers if disk_watches[w.log_path].check()[0]), None)):
                    failed = full
                    break
                line = progress() if progress and failed is None else None
                if line and line != last:
                    print(f"{stage}: {line}", flush=True)
                    last = line
        finally:
            signal.signal(signal.SIGTERM, previous)
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            stop_descendants()  # MaxText's data workers outlive a killed MaxText
    elapsed = time.monotonic() - started
    killed_for_memory = any(oom_kills(c) > before for c, before in oom_before.items())
    if failed is None and on_oom and killed_for_memory and finished is not None and not finished():
        raise MaxTextFailed(
            out_of_memory(module, elapsed, max(peaks.values(), default=0), progress_every, on_oom), workers[0].log_path
        )
    if failed is not None:
        code = children[workers.index(failed)].returncode
        if code in (-signal.SIGTERM, -signal.SIGINT):
            raise Interrupted(f"{module} stopped by {signal.Signals(-code).name} after {elapsed:.0f} s")
        # (128 + 9: a worker started through a shell, which reports its child's SIGKILL so.)
        if code in (-signal.SIGKILL, 128 + signal.SIGKILL) and on_oom and killed_for_memory:
            peak = peaks.get(children[workers.index(failed)].pid, 0)
            raise MaxTextFailed(out_of_memory(module, elapsed, peak, progress_every, on_oom), failed.log_path)
        full, path = disk_watches[failed.log_path].check()
        if full:
            path = path or output_directory(failed.command)
            raise MaxTextFailed(disk_full(module, elapsed, path, on_disk_full), failed.log_path)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"failed (exit {code})"
        who = f"{module} on {failed.name}" if len(workers) > 1 else module
        rest = "; the other workers were stopped" if len(workers) > 1 else ""
        raise MaxTextFailed(
            f"{who} {how} after {elapsed:.0f} s{rest}. Last lines of {failed.log_path}:\n{_tail(failed.log_path, 25)}",
            failed.log_path,
        )
    print(f"{stage}: {module} done in {elapsed:.1f} s", flush=True)


def high_water_mark(pid: int) -> int:
    """The most memory the process has held resident so far, in bytes (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def out_of_memory(module: str, elapsed: float, peak: int, every: float, advice: str) -> str:
    """The one line for a MaxText process the kernel killed for memory: the most it was seen
    to hold (read every `every` seconds: it grew further before the kill), the machine's
    memory, and what to change."""
    total = psutil.virtual_memory().total
    return (
        f"{module} was killed by the kernel for lack of memory (its out-of-memory killer) after {elapsed:.0f} s; "
        f"it held {peak / 1e9:.2f} GB resident when last read, at most {every:g} s before, of this machine's "
        f"{total / 1e9:.1f} GB. "
        f"To need less: {advice}"
    )


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


def log_progress(stage: str, label: str) -> Callable[[], str | None]:
    """A progress poller reporting the last tqdm percentage ("NN%|") MaxText wrote to the
    stage's log, in steps of 25%."""
    log_path = os.path.join(LOG_DIR, f"{stage}.log")

    def poll() -> str | None:
        try:
            with open(log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(log_path) - 4096))
                chunk = f.read().decode(errors="replace")
        except OSError:
            return None
        found = re.findall(r"(\d+)%\|", chunk)
        return f"{label} {int(found[-1]) // 25 * 25}%" if found else None

    return poll


def last_line(stage: str, prefix: str) -> Callable[[], str | None]:
    """A progress poller reporting the last line of the stage's log that starts with `prefix`
    (our own child modules' progress lines), without the prefix."""
    log_path = os.path.join(LOG_DIR, f"{stage}.log")

    def poll() -> str | None:
        try:
            with open(log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(log_path) - 16384))
                chunk = f.read().decode(errors="replace")
        except OSError:
            return None
        found = [line for line in chunk.splitlines() if line.startswith(prefix)]
        return found[-1][len(prefix) :] if found else None

    return poll
