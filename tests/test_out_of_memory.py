"""A MaxText process the kernel's out-of-memory killer ends (stages/lib/maxtext_process.py) is
said so in one line, with the memory it was seen to hold and what to change; a kill by anyone
else is not taken for one. The kernel's own killer, in a memory cgroup of its own
(testkit/machine_faults.py); the process a stand-in that only allocates."""

import os
import signal
import sys

import pytest

from stages.lib import maxtext_process
from stages.lib.maxtext_process import MaxTextFailed, Worker
from testkit import machine_faults

pytestmark = pytest.mark.skipif(bool(machine_faults.unavailable()), reason=str(machine_faults.unavailable()))
ADVICE = "lower train.per_device_batch_size (now 8)"


def worker(tmp_path, group, program: str) -> Worker:
    """A process that joins `group` (its procs file) before it runs `program`."""
    join = f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -c '{program}'"
    return Worker("MaxText", ["sh", "-c", join], dict(os.environ), str(tmp_path / "worker.log"))


def test_a_process_killed_for_memory_is_said_so_with_what_it_held(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grow = 'import time\nheld = []\nwhile True:\n    held.append(bytearray(b"\\1") * (8 << 20))\n    time.sleep(0.02)'
    with machine_faults.memory_group() as group:
        group.limit(256 << 20)
        with pytest.raises(MaxTextFailed) as failed:
            maxtext_process.run_workers("train", "train_sft", [worker(tmp_path, group.path, grow)], None, 0.05, ADVICE)
        assert group.oom_kills() == 1
    said = str(failed.value)
    assert "\n" not in said, said
    assert said.startswith("train_sft was killed by the kernel for lack of memory (its out-of-memory killer) after")
    held = float(said.split(" GB resident when last read")[0].rsplit(" ", 1)[1])
    assert 0.1 <= held <= 0.27, said  # what it held near the limit, read every 0.05 s
    assert said.endswith(f"To need less: {ADVICE}")


def test_a_sigkill_from_anyone_else_is_not_taken_for_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kill_self = f"import os\nos.kill(os.getpid(), {int(signal.SIGKILL)})"
    with machine_faults.memory_group() as group:
        with pytest.raises(MaxTextFailed) as failed:
            maxtext_process.run_workers(
                "train", "train_sft", [worker(tmp_path, group.path, kill_self)], None, 0.05, ADVICE
            )
    assert "train_sft was killed by SIGKILL after" in str(failed.value) and "lack of memory" not in str(failed.value)
