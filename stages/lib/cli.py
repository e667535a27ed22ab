"""How a stage starts and how it fails.

Bad input (params, data, a missing checkpoint, no disk) is a `UserError`: the stage prints
one line naming the field or file and the fix, and exits 2 before any expensive work. A
failure inside MaxText is reported by `maxtext.run` with the tail of its log.
"""

import ctypes
import os
import signal
import sys
import time


class UserError(Exception):
    """Something the user can fix; printed as one line, without a traceback."""


class StageFailed(Exception):
    """The work itself failed (MaxText crashed, the export check rejected the export)."""


class Interrupted(Exception):
    """The work was stopped by a signal (Ctrl-C, kill, a preempted VM's shutdown)."""


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent dies (Linux prctl)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def adopt_orphans() -> None:
    """Make this process the parent of any descendant whose own parent dies (Linux prctl),
    so that MaxText's data workers, orphaned when MaxText is killed, can still be found and
    stopped (stages/lib/maxtext.py) instead of lingering under init."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def run(main, stage: str) -> None:
    """Runs a stage's main(), turning UserError into one line on stderr and exit code 2."""
    # If `dvc repro` is killed, stop too (and MaxText with us: maxtext.run forwards SIGTERM),
    # rather than training on as an orphan that a new `dvc repro` would race.
    die_with_parent()
    adopt_orphans()
    started = time.monotonic()
    try:
        main()
        if os.environ.get("DVC_STAGE"):  # set by DVC for stage commands: time them in the repro log
            # (bench/pipeline.py reads these); commands run by hand stay quiet.
            print(f"{stage}: done in {time.monotonic() - started:.1f} s", flush=True)
    except UserError as e:
        print(f"{stage}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except StageFailed as e:
        print(f"{stage}: failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except (KeyboardInterrupt, Interrupted) as e:
        why = f" ({e})" if str(e) else ""
        print(f"{stage}: interrupted{why}; nothing was written to its outputs. `dvc repro` runs it again"
              + (", resuming from the newest checkpoint" if stage == "train" else ""), file=sys.stderr, flush=True)
        sys.exit(130)


def repo_root() -> str:
    """The workspace root (where dvc.yaml lives); stages are run from it by DVC."""
    here = os.path.abspath(os.getcwd())
    while not os.path.exists(os.path.join(here, "dvc.yaml")):
        parent = os.path.dirname(here)
        if parent == here:
            raise UserError("no dvc.yaml in this directory or above; run stages from the project root")
        here = parent
    return here
