"""An offline install for a TPU VM with no route to the internet (VPC Service Controls, a
private network, or this workplace's chip machine): what the pipeline's stages need on the TPU,
built on a connected machine, carried over in pieces, installed with no network.

    # on a connected x86-64 Linux machine, in a clone of the project:
    python3 -m tools.tpu_bundle build --out tpu-bundle --piece-mb 60
    # carry tpu-bundle/ to the VM (gcloud compute scp, a bucket the VM can read, a disk...), then there:
    python3 -m tools.tpu_bundle install tpu-bundle      # or: scripts/setup-tpu.sh --offline tpu-bundle

What a bundle holds (one tar stream cut into pieces of at most --piece-mb MB, each with its
SHA-256 in manifest.json):
  python/      a CPython 3.12 runtime: --python's install, trimmed of its tests, IDLE and Tk; the
               shared libraries its modules link that a bare Linux lacks ride along in lib/,
               and its programs find them through an $ORIGIN-relative search path (patchelf)
  wheels/      requirements/tpu.lock's pins of the distributions requirements/tpu-offline.txt
               names (the ones the stages import on the TPU, nothing else: no torch, no
               TensorFlow), for CPython 3.12 on x86-64 Linux; and uv, which installs them
  offline.txt  the pins, for uv's --no-deps install (the lock is fully resolved)

install checks every piece's size and SHA-256 before it unpacks anything (a missing or damaged
piece is named, with what to do), then lays out the same .venv as scripts/setup-tpu.sh: the
runtime in .python/, `.venv` made from it, the pins installed into it. Nothing half-installed is
left looking valid: the venv is built beside and moved into place last.

Only the standard library is used here: on the VM this runs on its own python3 (3.9 or later:
Ubuntu 22.04, the tutorial's image, has 3.10; tests/test_tpu_bundle.py installs from Debian 11's
3.9), before any .venv exists.
"""

from __future__ import annotations  # (the annotations below are 3.10's syntax; 3.9 reads them as text)

import argparse
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "requirements", "tpu.lock")
DATA_LOCK = os.path.join(ROOT, "requirements", "data.lock")  # the benchmark's data packages
OFFLINE_LIST = os.path.join(ROOT, "requirements", "tpu-offline.txt")
MANIFEST = "manifest.json"
FORMAT = 1
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")
# glibc's own libraries: every Linux has them, and a copy of them must never ride along.
GLIBC = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libnsl|libcrypt|linux-vdso)\.so")
# What a runtime carries that no stage uses: its test suite (~30% of it), IDLE, Tk.
TRIM = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3/tests", "ensurepip/_bundled")
# manylinux tags a wheel for x86-64 Linux may carry: pip matches them exactly. 2_35 is the
# tutorial's Ubuntu 22.04 (requirements/tpu.lock is resolved for it).
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 36)
]
UV_PIN = "uv==0.13.9"  # what scripts/setup-tpu.sh installs with
PATCHELF_PIN = "patchelf==0.17.2.4"  # a static binary in a wheel, for the runtime's search paths (build only)


class BundleError(Exception):
    """A failure with one line that says what is wrong and what to do."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(lock: str) -> dict[str, str]:
    """name -> version of every pin in a uv-compiled lock."""
    pins = {}
    with open(lock) as f:
        for line in f:
            m = PIN.match(line.strip())
            if m:
                pins[normalise(m.group(1))] = m.group(2)
    return pins


def offline_names(path: str = OFFLINE_LIST) -> list[str]:
    """The distributions an offline install carries (requirements/tpu-offline.txt)."""
    with open(path) as f:
        return [normalise(line.split("#")[0].strip()) for line in f if line.split("#")[0].strip()]


def offline_pins(lock: str = LOCK, names_file: str = OFFLINE_LIST) -> list[str]:
    """`name==version` for each distribution of the offline list, at the lock's version (the data
    packages' at requirements/data.lock's)."""
    pins = {**lock_pins(DATA_LOCK), **lock_pins(lock)}
    missing = [n for n in offline_names(names_file) if n not in pins]
    if missing:
        raise BundleError(
            f"{os.path.relpath(names_file, ROOT)}: {', '.join(missing)} not pinned in {os.path.relpath(lock, ROOT)}; "
            "remove the line or add the package to the lock"
        )
    return [f"{n}=={pins[n]}" for n in offline_names(names_file)]


# ---- build (on a connected machine) ----


def pip(*args: str, failure: str) -> None:
    """This interpreter's pip; a failure is one line: `failure`, then pip's last word."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BundleError(f"{failure}: {(done.stderr.strip().splitlines() or ['pip failed'])[-1]}")


def download_wheels(pins: list[str], dest: str) -> None:
    """Wheels for CPython 3.12 on x86-64 Linux, whatever this machine is (pip's --platform)."""
    tags = [a for p in PLATFORMS for a in ("--platform", p)]
    target = ["--prefer-binary", "--python-version", "3.12", "--implementation", "cp", *tags]
    pip("download", "--no-deps", *target, "-d", dest, *pins, failure="downloading the wheels")
    # A pin PyPI has only as source (antlr4-python3-runtime 4.9.3) is built into a wheel here:
    # the VM cannot build anything (no network for the build's own requirements).
    for name in sorted(os.listdir(dest)):
        if not name.endswith(".whl"):
            failure = f"{name}: only a source distribution on PyPI, and it does not build into a wheel"
            pip("wheel", "--no-deps", "-w", dest, os.path.join(dest, name), failure=failure)
            os.remove(os.path.join(dest, name))
    impure = [n for n in os.listdir(dest) if n.endswith(".whl") and "linux_x86_64" in n and "manylinux" not in n]
    if impure:
        raise BundleError(f"{impure[0]}: built from source for this machine only; pin a version PyPI has a wheel of")


def elf_files(prefix: str):
    """The interpreter and every shared object of a Python install."""
    for folder, _, files in os.walk(prefix):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path) and (name.endswith(".so") or ".so." in name or folder.endswith("/bin")):
                with open(path, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        yield path


def linked_libraries(paths: list[str]) -> dict[str, str]:
    """soname -> path of the libraries these objects load that are not glibc's nor the runtime's."""
    found = {}
    for path in paths:
        done = subprocess.run(["ldd", path], capture_output=True, text=True)
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/") and not GLIBC.match(parts[0]):
                found.setdefault(parts[0], parts[2])
    return found


def patchelf_binary(work: str) -> str:
    """patchelf, from PATH or from its PyPI wheel (a static binary)."""
    on_path = shutil.which("patchelf")
    if on_path:
        return on_path
    pip("download", "--no-deps", "--only-binary=:all:", "-d", work, PATCHELF_PIN, failure=f"downloading {PATCHELF_PIN}")
    return wheel_program(work, "patchelf", work)


def wheel_program(wheels: str, name: str, work: str) -> str:
    """The program a wheel ships in its scripts (patchelf, uv: static binaries), unpacked to work."""
    wheel = next(f for f in os.listdir(wheels) if f.startswith(f"{name}-") and f.endswith(".whl"))
    with zipfile.ZipFile(os.path.join(wheels, wheel)) as z:
        member = next(n for n in z.namelist() if n.endswith(f"/scripts/{name}"))
        z.extract(member, work)
    path = os.path.join(work, member)
    os.chmod(path, 0o755)
    return path


def stage_runtime(prefix: str, dest: str, work: str) -> dict:
    """A copy of the Python install at `prefix` that runs from anywhere: trimmed, its foreign
    libraries in lib/, every ELF file's search path made relative to itself."""
    version = subprocess.run(
        [os.path.join(prefix, "bin", "python3.12"), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    )
    if version.returncode != 0:
        raise BundleError(f"--python {prefix}: no bin/python3.12 there runs (MaxText 0.2.5 needs CPython 3.12)")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.a", "pkgconfig", "site-packages")
    shutil.copytree(prefix, dest, symlinks=True, ignore=ignore)
    stdlib = os.path.join(dest, "lib", "python3.12")
    for part in TRIM:
        shutil.rmtree(os.path.join(stdlib, part), ignore_errors=True)
    for name in os.listdir(os.path.join(stdlib, "lib-dynload")):
        if name.startswith("_tkinter"):
            os.remove(os.path.join(stdlib, "lib-dynload", name))
    os.makedirs(os.path.join(stdlib, "site-packages"), exist_ok=True)
    elves = list(elf_files(dest))
    libraries = linked_libraries(elves)
    own = {os.path.basename(p) for p in elves}
    carried = sorted(n for n in libraries if n not in own)
    for name in carried:
        shutil.copy2(libraries[name], os.path.join(dest, "lib", name))
    patchelf = patchelf_binary(work)
    lib = os.path.join(dest, "lib")
    for path in [*elves, *(os.path.join(lib, n) for n in carried)]:
        relative = os.path.relpath(lib, os.path.dirname(path))
        rpath = "$ORIGIN" if relative == "." else f"$ORIGIN/{relative}"
        os.chmod(path, os.stat(path).st_mode | 0o200)
        subprocess.run([patchelf, "--force-rpath", "--set-rpath", rpath, path], check=True, capture_output=True)
    return {
        "python": version.stdout.strip(),
        "carried_libraries": carried,
        "glibc": glibc_needed(elves, libraries, carried),
    }


def glibc_needed(elves: list[str], libraries: dict[str, str], carried: list[str]) -> str | None:
    """The newest GLIBC_x.y symbol version the runtime references: a VM with an older glibc
    cannot run it (install says so before unpacking)."""
    if not shutil.which("objdump"):  # binutils: without it the VM's check is skipped (install says so)
        return None
    newest = (2, 0)
    for path in [*elves, *(libraries[n] for n in carried)]:
        done = subprocess.run(["objdump", "-T", path], capture_output=True, text=True)
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", done.stdout):
            newest = max(newest, (int(major), int(minor)))
    return f"{newest[0]}.{newest[1]}"


def write_pieces(source: str, out: str, piece_bytes: int) -> list[dict]:
    """The archive cut into pieces of at most piece_bytes, each named with its size and SHA-256."""
    pieces = []
    with open(source, "rb") as f:
        while True:
            chunk = f.read(piece_bytes)
            if not chunk:
                break
            name = f"piece-{len(pieces):03d}"
            with open(os.path.join(out, name), "wb") as p:
                p.write(chunk)
            pieces.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return pieces


def write_bundle(archive: str, out: str, piece_bytes: int, **about) -> dict:
    """`archive` cut into pieces in `out` beside their manifest.json (what `about` says, each
    piece's size and SHA-256), written beside and moved into place whole."""
    staging = out.rstrip("/") + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    manifest = {
        "format": FORMAT,
        **about,
        "archive_bytes": os.path.getsize(archive),
        "archive_sha256": sha256_file(archive),
        "pieces": write_pieces(archive, staging, piece_bytes),
    }
    with open(os.path.join(staging, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    if os.path.isdir(out) and not os.listdir(out):
        os.rmdir(out)
    os.replace(staging, out)
    return manifest


PORTABLE_ADVICE = (
    "a portable CPython 3.12 (python-build-standalone: `.venv/bin/uv python install 3.12`, then --python "
    '"$(.venv/bin/uv python find --managed-python 3.12)")'
)
ANY_ADVICE = PORTABLE_ADVICE + ', or this machine\'s own (--python "$(command -v python3.12)")'


def python_prefix(given: str) -> str:
    """The install prefix of the CPython 3.12 that --python names: an interpreter (`uv python
    find` prints one; a venv's is followed to the install it was made from) or a prefix."""
    candidates = (
        [given] if os.path.isfile(given) else [os.path.join(given, "bin", n) for n in ("python3.12", "python3")]
    )
    for interpreter in filter(os.path.isfile, candidates):
        found = subprocess.run(
            [interpreter, "-c", "import platform, sys; print(platform.python_version()); print(sys.base_prefix)"],
            capture_output=True,
            text=True,
        )
        version, _, prefix = found.stdout.strip().partition("\n")
        if (
            found.returncode == 0
            and version.startswith("3.12.")
            and os.path.isfile(os.path.join(prefix, "bin", "python3.12"))
        ):
            return prefix
        if found.returncode == 0:
            raise BundleError(
                f"--python {given}: CPython {version}, not 3.12 (MaxText 0.2.5 needs 3.12); use {ANY_ADVICE}"
            )
    raise BundleError(f"--python {given}: neither a CPython 3.12 interpreter nor the prefix of one; use {ANY_ADVICE}")


def runtime_glibc(prefix: str) -> str | None:
    """The newest glibc the interpreter and its own modules need (objdump), before anything is
    carried: a VM's must be as new."""
    elves = [p for p in elf_files(prefix) if "site-packages" not in p]
    return glibc_needed(elves, {}, [])


def build(out: str, piece_mb: float, python: str, lock: str, names_file: str, vm_glibc: str) -> dict:
    if os.path.exists(out) and os.listdir(out):
        raise BundleError(f"--out {out}: exists and is not empty; give a new directory")
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise BundleError("build: run it on x86-64 Linux (the runtime it carries is this machine's)")
    python_prefix_ = python_prefix(python)  # a bad --python or glibc: one line, before any download
    needed = runtime_glibc(python_prefix_)
    if needed and tuple(map(int, needed.split("."))) > tuple(map(int, vm_glibc.split("."))):
        raise BundleError(
            f"--python {python}: needs glibc {needed}, newer than the VM's {vm_glibc} (--vm-glibc); "
            f"use {PORTABLE_ADVICE}"
        )
    pins = offline_pins(lock, names_file)
    started = time.time()
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out)) or ".") as work:
        wheels = os.path.join(work, "wheels")
        os.makedirs(wheels)
        print(f"tpu_bundle: downloading {len(pins)} wheels (requirements/tpu.lock's pins) and {UV_PIN}", flush=True)
        download_wheels([*pins, UV_PIN], wheels)
        print(f"tpu_bundle: the Python runtime from {python_prefix_}", flush=True)
        runtime = stage_runtime(python_prefix_, os.path.join(work, "python"), os.path.join(work, "tools"))
        with open(os.path.join(work, "offline.txt"), "w") as f:
            f.write("\n".join(pins) + "\n")
        archive = os.path.join(work, "bundle.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(os.path.join(work, "offline.txt"), "offline.txt")
            tar.add(os.path.join(work, "python"), "python")
            for name in sorted(os.listdir(wheels)):
                tar.add(os.path.join(wheels, name), f"wheels/{name}")
        manifest = write_bundle(
            archive,
            out,
            int(piece_mb * 1e6),
            lock_sha256=sha256_file(lock),
            wheels=sorted(os.listdir(wheels)),
            **runtime,
        )
    pieces = manifest["pieces"]
    total, glibc = sum(p["bytes"] for p in pieces), runtime["glibc"] or "?"
    print(
        f"tpu_bundle: wrote {out}/: {len(pieces)} pieces, {total / 1e6:.0f} MB, Python {runtime['python']} "
        f"(needs glibc >= {glibc}), {len(manifest['wheels'])} wheels, in {time.time() - started:.0f} s",
        flush=True,
    )
    return manifest


# ---- install (on the VM, no network) ----


def read_manifest(bundle: str) -> dict:
    path = os.path.join(bundle, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read it ({e}); copy the whole bundle directory again") from None
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: bundle format {manifest.get('format')}, this install reads {FORMAT}; rebuild it")
    return manifest


def check_pieces(bundle: str, manifest: dict) -> None:
    """Every piece there, of its size and hash: one line naming the first that is not."""
    for piece in manifest["pieces"]:
        path = os.path.join(bundle, piece["name"])
        if not os.path.exists(path):
            raise BundleError(f"{path}: missing ({len(manifest['pieces'])} pieces make the bundle); copy it again")
        size = os.path.getsize(path)
        if size != piece["bytes"]:
            raise BundleError(f"{path}: {size} bytes, the manifest says {piece['bytes']}; copy it again")
        if sha256_file(path) != piece["sha256"]:
            raise BundleError(f"{path}: its SHA-256 differs from the manifest's (damaged in transit); copy it again")


def check_glibc(manifest: dict) -> None:
    if manifest["glibc"] is None:
        print("tpu_bundle: note: the bundle does not say which glibc its Python needs (built without objdump)")
        return
    have = platform.libc_ver()[1] or "0"
    if tuple(map(int, have.split(".")[:2])) < tuple(map(int, manifest["glibc"].split("."))):
        raise BundleError(
            f"this VM's glibc is {have}, the bundle's Python needs {manifest['glibc']}: build the bundle with "
            f"{PORTABLE_ADVICE}"
        )


class Pieces(io.RawIOBase):
    """The pieces read back as one stream (the archive is never on disk twice)."""

    def __init__(self, paths: list[str]):
        self.paths, self.current = list(paths), None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self.current is None:
                if not self.paths:
                    return 0
                self.current = open(self.paths.pop(0), "rb")
            n = self.current.readinto(buffer)
            if n:
                return n
            self.current.close()
            self.current = None


def extract(bundle: str, manifest: dict, dest: str, mode: str) -> None:
    """The checked pieces, read back as one tar stream (never on disk twice), into dest."""
    stream = io.BufferedReader(Pieces([os.path.join(bundle, p["name"]) for p in manifest["pieces"]]), 1 << 20)
    with tarfile.open(fileobj=stream, mode=mode) as tar:
        for member in tar:
            if member.name.startswith("/") or ".." in member.name.split("/"):
                raise BundleError(f"{bundle}: the archive names {member.name!r}, outside its directory; rebuild it")
            tar.extract(member, dest)


def own_environment() -> dict[str, str]:
    """This environment less what points a Python at a standard library: the bundle's
    interpreter finds its own, and a PYTHONHOME or PYTHONPATH meant for the python3 running
    the install (another version's) would send it there and stop it before it starts."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}


def install(bundle: str, project: str) -> None:
    started = time.time()
    manifest = read_manifest(bundle)
    check_pieces(bundle, manifest)
    check_glibc(manifest)
    venv, runtime = os.path.join(project, ".venv"), os.path.join(project, ".python")
    stamp = os.path.join(venv, ".tpu-bundle.sha256")
    if os.path.exists(stamp) and open(stamp).read().strip() == manifest["archive_sha256"]:
        print(f"tpu_bundle: {venv} already holds this bundle", flush=True)
        return
    work = tempfile.mkdtemp(prefix=".tpu-bundle-", dir=project)
    try:
        extract(bundle, manifest, work, "r|")
        # The runtime and the venv made from it replace any earlier ones, each moved in whole.
        shutil.rmtree(runtime, ignore_errors=True)
        os.replace(os.path.join(work, "python"), runtime)
        python = os.path.join(runtime, "bin", "python3.12")
        partial = os.path.join(work, "venv")
        subprocess.run([python, "-m", "venv", "--without-pip", partial], check=True, env=own_environment())
        uv = wheel_program(os.path.join(work, "wheels"), "uv", work)
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--offline",
                "--no-index",
                "--no-deps",
                "--find-links",
                os.path.join(work, "wheels"),
                "--python",
                os.path.join(partial, "bin", "python"),
                "--link-mode=copy",
                "--compile-bytecode",
                "-r",
                os.path.join(work, "offline.txt"),
            ],
            check=True,
            env=own_environment(),  # (it compiles the bytecode with the venv's interpreter)
        )
        shutil.rmtree(venv, ignore_errors=True)
        # A venv names its own path in its scripts: made beside, it is made again in place (the
        # installed packages stay), then moved whole.
        os.replace(partial, venv)
        subprocess.run([python, "-m", "venv", "--without-pip", venv], check=True, env=own_environment())
        fix_scripts(venv, partial)
        with open(stamp, "w") as f:
            f.write(manifest["archive_sha256"] + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"tpu_bundle: installed {len(manifest['wheels']) - 1} packages into {venv} (Python {manifest['python']}, "
        f"offline) in {time.time() - started:.0f} s. Next: source .venv/bin/activate && dvc repro",
        flush=True,
    )


def fix_scripts(venv: str, old: str) -> None:
    """Console scripts (dvc, ...) name the interpreter they were installed for: the venv's new place."""
    bin_dir = os.path.join(venv, "bin")
    for name in os.listdir(bin_dir):
        path = os.path.join(bin_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if data.startswith(b"#!") and old.encode() in data:
            with open(path, "wb") as f:
                f.write(data.replace(old.encode(), venv.encode()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.tpu_bundle", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="on a connected machine: the bundle, in pieces")
    b.add_argument("--out", required=True, help="a new directory for the pieces and manifest.json")
    b.add_argument("--piece-mb", type=float, default=60.0, help="the largest piece, in MB (a transfer's limit)")
    b.add_argument(
        "--python",
        default=sys.base_prefix,
        help="the CPython 3.12 to carry: its interpreter or its install prefix (default: this one's)",
    )
    b.add_argument(
        "--vm-glibc",
        default="2.35",
        help="the VM's glibc: a --python that needs a newer one is refused (default 2.35, Ubuntu 22.04's)",
    )
    b.add_argument("--lock", default=LOCK, help=argparse.SUPPRESS)
    b.add_argument("--names", default=OFFLINE_LIST, help=argparse.SUPPRESS)
    i = sub.add_parser("install", help="on the VM, offline: .venv from the bundle")
    i.add_argument("bundle")
    i.add_argument("--project", default=ROOT, help="the project checkout to install .venv into")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.out, args.piece_mb, args.python, args.lock, args.names, args.vm_glibc)
        else:
            install(os.path.abspath(args.bundle), os.path.abspath(args.project))
    except BundleError as e:
        print(f"tpu_bundle: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
