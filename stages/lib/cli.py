"""How a stage starts and how it fails.

Bad input (params, data, a missing checkpoint, no disk) is a `UserError`: the stage prints
one line naming the field or file and the fix, and exits 2 before any expensive work. A
failure inside MaxText is reported by `maxtext_process.run` with the tail of its log (in one
line when the kernel killed it for memory or the disk was full). A full disk met by the stage's
own writes is one line too; what it had half written is in a staging directory that goes with
it (stages/lib/outputs.py).
"""

import ctypes
import errno
import json
import os
import signal
import sys
import time

from stages.shared.errors import Interrupted, StageFailed, UserError

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent dies (Linux prctl)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def adopt_orphans(adopt: bool = True) -> None:
    """Make this process the parent of any descendant whose own parent dies (Linux prctl),
    so that MaxText's data workers, orphaned when MaxText is killed, can still be found and
    stopped (stages/lib/maxtext_process.py) instead of lingering under init. adopt=False:
    leave them to init, which reaps them (tools/grid.py's local workers)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(adopt))


STAGE_TIMES = os.path.join("logs", "stage_times.json")


def record_time(stage: str, seconds: float) -> None:
    """Each stage's duration in its last run, for tools/summary.py (a log, not a DVC output)."""
    from stages.lib import outputs

    try:
        with open(STAGE_TIMES) as f:
            times = json.load(f)
    except (OSError, ValueError):
        times = {}
    times[stage] = round(seconds, 2)
    outputs.write_json(STAGE_TIMES, times)


def run(main, stage: str) -> None:
    """Runs a stage's main(), turning UserError into one line on stderr and exit code 2."""
    # If `dvc repro` is killed, stop too (and MaxText with us: maxtext_process.run forwards SIGTERM),
    # rather than training on as an orphan that a new `dvc repro` would race.
    die_with_parent()
    adopt_orphans()
    started = time.monotonic()
    try:
        main()
        from stages.lib.params import record_keys_read

        record_keys_read(stage)
        if os.environ.get("DVC_STAGE"):  # set by DVC for stage commands: time them in the repro log
            # (bench/pipeline.py reads these) and in logs/ (tools/summary.py); commands run by
            # hand stay quiet.
            seconds = time.monotonic() - started
            print(f"{stage}: done in {seconds:.1f} s", flush=True)
            record_time(stage, seconds)
    except UserError as e:
        print(f"{stage}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except StageFailed as e:
        print(f"{stage}: failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        from stages.lib import hardware

        where = hardware.writing_on_full_disk(e.filename)
        print(f"{stage}: failed: out of disk space{where}. {hardware.FULL_DISK_ADVICE}", file=sys.stderr, flush=True)
        sys.exit(1)
    except (KeyboardInterrupt, Interrupted) as e:
        why = f" ({e})" if str(e) else ""
        print(
            f"{stage}: interrupted{why}; nothing was written to its outputs. `dvc repro` runs it again"
            + (", resuming from the newest checkpoint" if stage == "train" else ""),
            file=sys.stderr,
            flush=True,
        )
        sys.exit(130)
