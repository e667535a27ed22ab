"""The pipeline's three ways to stop, in a module that imports nothing of ours, so that any
module can raise them (stages/lib/cli.py turns each into one line and an exit code)."""


class UserError(Exception):
    """Something the user can fix; printed as one line, without a traceback."""


class StageFailed(Exception):
    """The work itself failed (MaxText crashed, the export check rejected the export)."""


class Interrupted(Exception):
    """The work was stopped by a signal (Ctrl-C, kill, a preempted VM's shutdown)."""
