"""Writing stage outputs so that nothing half-written ever looks complete.

Each output is built in a hidden sibling directory and renamed into place only when whole.
A stage that fails or is killed leaves at most a `.<name>.tmp-*` directory, which is not a
DVC output and is swept away by the next run, so `dvc commit`/`dvc push` can never take a
partial checkpoint for a finished one.
"""

import contextlib
import glob
import json
import os
import shutil
import tempfile


def remove(path: str) -> None:
    """Deletes a file, link or directory tree (DVC's read-only cache links included)."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


@contextlib.contextmanager
def staged_dir(path: str):
    """Yields an empty temporary directory that becomes `path` if the block succeeds."""
    parent, name = os.path.split(os.path.normpath(path))
    parent = parent or "."
    os.makedirs(parent, exist_ok=True)
    for stale in glob.glob(os.path.join(parent, f".{name}.tmp-*")):
        remove(stale)  # left by a killed run
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        yield tmp
    except BaseException:
        remove(tmp)
        raise
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    remove(path)
    os.rename(tmp, path)


def write_text(path: str, text: str) -> None:
    """Writes a file atomically (temp file + rename): readers see the old file or the new one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
    except BaseException:
        remove(tmp)  # (a full disk: no half-written file left behind)
        raise
    os.replace(tmp, path)


def read_json(path: str, missing=None):
    """A JSON file's contents, or `missing` when it is absent or unreadable (a stage that has
    not run yet, one cut short)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return missing


def write_json(path: str, data) -> None:
    """Writes JSON atomically."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def link_or_copy_tree(src: str, dst: str) -> None:
    """Recreates src at dst with hard links (no data copied) or copies across filesystems."""

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)
