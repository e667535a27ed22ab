"""How a stage starts and how it fails.

Bad input (params, data, a missing checkpoint, no disk) is a `UserError`: the stage prints
one line naming the field or file and the fix, and exits 2 before any expensive work. A
failure inside MaxText is reported by `maxtext.run` with the tail of its log.
"""

import os
import sys


class UserError(Exception):
    """Something the user can fix; printed as one line, without a traceback."""


class StageFailed(Exception):
    """The work itself failed (MaxText crashed, the export check rejected the export)."""


def run(main, stage: str) -> None:
    """Runs a stage's main(), turning UserError into one line on stderr and exit code 2."""
    try:
        main()
    except UserError as e:
        print(f"{stage}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except StageFailed as e:
        print(f"{stage}: failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{stage}: interrupted", file=sys.stderr, flush=True)
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
