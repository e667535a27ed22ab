"""Session fixtures built once per test run and shared by every pytest-xdist worker."""

import json
import os
from pathlib import Path


def run_dir(tmp_path_factory) -> Path:
    """The directory every worker of this test run shares (pytest-xdist gives each worker its
    own base directory inside it); without xdist, the base directory itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def built_once(tmp_path_factory, name: str, build) -> dict:
    """`build()` -> a JSON-able dict, run by the first worker that asks; the others wait for
    it and read the same dict. (Should it fail, the next worker to ask tries again.)"""
    from filelock import FileLock

    root = run_dir(tmp_path_factory)
    record = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not record.exists():
            record.write_text(json.dumps(build()))
    return json.loads(record.read_text())
