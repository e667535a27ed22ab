"""Shared fixtures: throw-away copies of the project that run the real pipeline.

Tests never touch the checkout they live in. `workspace()` copies the project's files (the
working tree, uncommitted changes included) into a temporary git repository, switched to the
tiny recipe. The expensive fixture, `tiny_run`, runs `dvc repro` once per session; tests
that need a variant clone it (`clone_of_tiny_run`) and share its DVC cache, so only the
stages the variant changes run again. All workspaces share one JAX compilation cache.
"""

import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

# Tests that read checkpoints load JAX in this process; keep it off libtpu (installed for the
# fit check), whose lock would otherwise stop every later process that loads it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
GIT_ID = ["-c", "user.name=tests", "-c", "user.email=tests@example.invalid"]


def env(**extra) -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e['PATH']}"  # `python` and `dvc` in stage commands = this venv
    e.pop("PIPELINE_VERBOSE", None)
    # DVC runs stage commands through $SHELL; CI has none set, so DVC falls back to /bin/sh
    # (dash), which forks rather than execs. Use the same shell everywhere.
    e["SHELL"] = "/bin/sh"
    for key, value in extra.items():  # None removes a variable
        if value is None:
            e.pop(key, None)
        else:
            e[key] = value
    return e


def sh(args, cwd, check=True, timeout=1800, **env_extra) -> subprocess.CompletedProcess:
    """Runs a command; on an unexpected exit code the assertion shows its output."""
    started = time.monotonic()
    proc = subprocess.run(args, cwd=cwd, env=env(**env_extra), capture_output=True, text=True, timeout=timeout)
    proc.elapsed = time.monotonic() - started
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


# Results of running the pipeline in the checkout itself (git-tracked by DVC users, but never
# part of a fresh copy of the project).
RUN_RESULTS = ("dvc.lock", "metrics/", "plots/")


def project_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and (REPO / f).is_file() and not f.startswith(RUN_RESULTS)]


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory) -> Path:
    # Compiled train steps are reused across every pipeline run of the session (and across
    # sessions on one machine when PIPELINE_TEST_JAX_CACHE points somewhere persistent).
    path = os.environ.get("PIPELINE_TEST_JAX_CACHE")
    if not path:
        return tmp_path_factory.mktemp("jax-cache")
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory, jax_cache):
    """A function making a fresh copy of the project (tiny recipe, committed, no outputs)."""

    def make(name: str = "ws", recipe: str = "tiny") -> Path:
        root = copy_project(tmp_path_factory.mktemp(name), recipe)
        (root / ".cache").mkdir()
        (root / ".cache" / "jax").symlink_to(jax_cache, target_is_directory=True)
        return root

    return make


def copy_project(root: Path, recipe: str = "tiny") -> Path:
    """The project's files copied into root, switched to `recipe`, committed to a new git
    repository (so DVC experiments work). Also bench/'s fresh workspaces."""
    for f in project_files():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, root / f)
    sh([sys.executable, "-m", "stages.recipe", recipe], root)
    sh(["git", "init", "-q", "-b", "main"], root)
    sh(["git", *GIT_ID, "add", "-A"], root)
    sh(["git", *GIT_ID, "commit", "-q", "-m", "project"], root)
    return root


# A Hugging Face token that must never be written anywhere or passed on a command line. Made
# up per session, so that no file (this one included) can contain it by accident.
CANARY_TOKEN = "hf_canary" + secrets.token_hex(16)


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
                    if "stages." not in argv:
                        continue
                    self.seen_commands.add(argv)
                    if CANARY_TOKEN in argv:
                        self.leaks.append(f"argv of {argv[:120]}")
                    if "maxtext_main" in argv and CANARY_TOKEN.encode() in (proc / "environ").read_bytes():
                        self.leaks.append(f"environment of {argv[:120]}")
                except OSError:
                    continue  # the process ended between listing and reading


def run_pipeline(root: Path, **env_extra) -> SimpleNamespace:
    """`dvc repro` in root, results committed to its git repo like a user would."""
    watch = ProcessWatch()
    watch.start()
    try:
        proc = sh(["dvc", "repro"], root, **env_extra)
    finally:
        watch.stop_event.set()
        watch.join()
    sh(["git", *GIT_ID, "add", "-A"], root)
    sh(["git", *GIT_ID, "commit", "-q", "-m", "dvc repro"], root)
    return SimpleNamespace(path=root, output=proc.stdout + proc.stderr, seconds=proc.elapsed, watch=watch)


@pytest.fixture(scope="session")
def tiny_run(workspace) -> SimpleNamespace:
    """The tiny recipe run once with `dvc repro`, with a canary HF token in the environment.
    Read-only for tests: clone it to change it."""
    return run_pipeline(workspace("tiny-run"), HF_TOKEN=CANARY_TOKEN)


def clone_workspace(tiny_run, parent: Path, jax_cache: Path) -> Path:
    """A git clone of tiny_run sharing its DVC cache, outputs checked out: free to modify."""
    root = parent / "clone"
    sh(["git", "clone", "-q", str(tiny_run.path), str(root)], parent)
    (root / ".cache").mkdir()
    (root / ".cache" / "jax").symlink_to(jax_cache, target_is_directory=True)
    sh(["dvc", "cache", "dir", "--local", str(tiny_run.path / ".dvc" / "cache")], root)
    sh(["dvc", "checkout", "-q"], root)
    return root


@pytest.fixture
def clone_of_tiny_run(tiny_run, tmp_path, jax_cache) -> Path:
    return clone_workspace(tiny_run, tmp_path, jax_cache)


def stages_run(output: str) -> list[str]:
    """Names of the stages a `dvc repro` output says it ran."""
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]
