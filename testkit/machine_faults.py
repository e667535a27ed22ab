"""What a VM's kernel does when memory or disk runs out, aimed at one test's processes (as
root, which the suite is on these machines and in CI):

- memory: a memory cgroup (v1 or v2) whose limit is lowered under a running process tree, and
  a balloon that then fills what is left, as another job on the VM would. The kernel's own
  out-of-memory killer picks its victim as it does anywhere: the largest process (the balloon
  holds tens of MB; it cannot be exempted: lowering oom_score_adj needs CAP_SYS_RESOURCE,
  which root lacks in these VMs; it is made the second choice, MemoryGroup.squeeze says why);
- disk: a small filesystem of its own (tmpfs) mounted where a test points a stage, and a file
  that fills what is left of it, as a neighbour writing logs would."""

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")

# Grows 16 MB at a time, each page written (zeroed pages would not count), until the group's
# out-of-memory count rises past the first argument; then exits, its memory gone with it.
BALLOON = """
import sys, time
events, before = sys.argv[1], int(sys.argv[2])
def kills():
    for line in open(events):
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0
held = []
while kills() <= before:
    held.append(bytearray(b"\\x01") * (16 << 20))
    time.sleep(0.01)
"""


BALLOON_SCORE_ADJ = 250


class MemoryGroup:
    def __init__(self, path: Path, v1: bool):
        self.path, self.v1 = path, v1

    def _file(self, v1_name: str, v2_name: str) -> Path:
        return self.path / (v1_name if self.v1 else v2_name)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def usage(self) -> int:
        return int(self._file("memory.usage_in_bytes", "memory.current").read_text())

    def limit(self, nbytes: int | None) -> None:
        value = str(nbytes) if nbytes else ("-1" if self.v1 else "max")
        self._file("memory.limit_in_bytes", "memory.max").write_text(value)

    @property
    def events(self) -> Path:
        return self._file("memory.oom_control", "memory.events")

    def oom_kills(self) -> int:
        for line in self.events.read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def squeeze(self, headroom: int = 64 << 20) -> subprocess.Popen:
        """Caps the group just above what it uses now and starts the balloon in it: the kernel
        kills the group's largest process for memory. Returns the balloon's process.

        The balloon is the kernel's next choice after that: its oom_score_adj is raised by
        BALLOON_SCORE_ADJ (raising needs no privilege), which adds that many thousandths of the
        group's limit to its score. A second out-of-memory kill can follow the first before the
        killed process's memory is freed, charged to the balloon's next 16 MB (seen in a suite
        run: 0.1 s after MaxText, the stage's own process, 0.65 GB, was killed). With the raise,
        a tiny training's MaxText (~3.8 GB of a ~5 GB limit) still scores above the balloon
        (64 MB + 25% of the limit), and the balloon above the stage and DVC."""
        before = self.oom_kills()
        self.limit(self.usage() + headroom)

        def join():  # in the balloon, before it runs
            self.add(os.getpid())
            Path("/proc/self/oom_score_adj").write_text(str(BALLOON_SCORE_ADJ))

        return subprocess.Popen([sys.executable, "-c", BALLOON, str(self.events), str(before)], preexec_fn=join)


def unavailable() -> str | None:
    """Why these faults cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "a memory cgroup and a mount need root"
    if (V1 / "cgroup.procs").exists():
        return None
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return None
    return "no writable memory cgroup (v1 or v2) on this machine"


@contextlib.contextmanager
def memory_group():
    """A new memory cgroup, no limit yet; removed after (its processes back to the root group)."""
    v1 = (V1 / "cgroup.procs").exists()
    root = V1 if v1 else V2
    if not v1:
        with contextlib.suppress(OSError):
            (root / "cgroup.subtree_control").write_text("+memory")
    path = root / f"pipeline-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    group = MemoryGroup(path, v1)
    try:
        yield group
    finally:
        group.limit(None)
        for _ in range(50):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def small_disk(path: Path, megabytes: int):
    """A filesystem of `megabytes` mounted at `path` (made if missing), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path, leave_bytes: int = 0) -> Path:
    """Writes one file until the filesystem holding `disk` is full, then gives `leave_bytes` back;
    returns it (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:  # ENOSPC: full
            pass
    if leave_bytes:
        os.truncate(filler, max(0, filler.stat().st_size - leave_bytes))
    return filler
