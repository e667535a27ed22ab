"""Watching every process while a pipeline runs: the HF token must never appear on a command
line, nor in the environment of MaxText's processes (tests/test_secrets.py)."""

import hashlib
import os
import secrets
import threading
from pathlib import Path

# A Hugging Face token that must never be written anywhere or passed on a command line. Made
# up per test run (the same in every worker: one may check what another's run wrote), so
# that no file (this one included) can contain it by accident.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID")
CANARY_TOKEN = "hf_canary" + (hashlib.sha256(_RUN_ID.encode()).hexdigest()[:32] if _RUN_ID else secrets.token_hex(16))


class ProcessWatch(threading.Thread):
    """Samples every process's command line (and MaxText's environment) while a run lasts."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop_event = threading.Event()
        self.seen_commands: set[str] = set()
        self.leaks: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(0.1):
            for proc in Path("/proc").glob("[0-9]*"):
                try:
                    argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if "stages." not in argv and "tools." not in argv:
                        continue
                    self.seen_commands.add(argv)
                    if CANARY_TOKEN in argv:
                        self.leaks.append(f"argv of {argv[:120]}")
                    if "stages.in_maxtext.main" in argv and CANARY_TOKEN.encode() in (proc / "environ").read_bytes():
                        self.leaks.append(f"environment of {argv[:120]}")
                except OSError:
                    continue  # the process ended between listing and reading
