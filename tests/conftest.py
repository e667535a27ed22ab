"""The suite's fixtures: throw-away copies of the project that run the real pipeline.

The helpers they use live in testkit/ (bench/ uses them too): workspaces and commands
(testkit/workspace.py), the token-leak watch, results built once per test run for every
pytest-xdist worker (`built_once`), and the scheduler that keeps each test file on one
worker, longest first (testkit/xdist_schedule.py, loaded below as a plugin).

`workspace()` copies the project into a temporary git repository, switched to the tiny
recipe. The expensive fixture, `tiny_run`, runs `dvc repro` once per session; tests that need
a variant clone it (`clone_of_tiny_run`) and share its DVC cache, so only the stages the
variant changes run again. Every workspace, and every experiment DVC queues from one, points
`runtime.compile_cache_dir` at one JAX compilation cache for the session, so a train step
compiled once is compiled never again.

    scripts/test.sh -m "not slow"     # the fast layer: pure logic, in-process (~2 minutes)
    scripts/test.sh                   # everything, real pipeline runs included
"""

import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from testkit.built_once import built_once, run_dir
from testkit.process_watch import CANARY_TOKEN
from testkit.workspace import (
    EXPERIMENTS,
    GRID,
    REPO,
    clone_workspace,
    commit,
    copy_project,
    run_pipeline,
    run_queue,
    set_param,
    sh,
    with_real_4b_config,
)

pytest_plugins = ["testkit.xdist_schedule"]

# Tests that read checkpoints load JAX in this process; keep it off libtpu (installed for the
# fit check), whose lock would otherwise stop every later process that loads it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory) -> Path:
    # Compiled programs are reused across every pipeline run of the test run, by every
    # worker (and across runs on one machine when PIPELINE_TEST_JAX_CACHE points somewhere
    # persistent).
    path = Path(os.environ.get("PIPELINE_TEST_JAX_CACHE") or run_dir(tmp_path_factory) / "jax-cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def params_read_log(tmp_path_factory) -> Path:
    """Every stage any test of any worker runs appends the params keys it read here
    (stages/lib/params.py); tests/test_declared.py holds them against dvc.yaml."""
    path = run_dir(tmp_path_factory) / "params-read.log"
    os.environ["PIPELINE_PARAMS_READ_LOG"] = str(path)
    return path


@pytest.fixture(scope="session")
def workspace(tmp_path_factory, jax_cache):
    """A function making a fresh copy of the project (tiny recipe, committed, no outputs)."""

    def make(name: str = "ws", recipe: str = "tiny") -> Path:
        return copy_project(tmp_path_factory.mktemp(name), recipe, jax_cache)

    return make


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """The tiny recipe's base checkpoint (seed 0), built once: what base_model writes."""
    from stages.shared.families import gemma3

    def build() -> dict:
        path = tmp_path_factory.mktemp("tiny-base")
        gemma3.build_tiny(str(path), seed=0)
        return {"path": str(path)}

    return Path(built_once(tmp_path_factory, "tiny-base", build)["path"])


@pytest.fixture
def project_4b(tmp_path, monkeypatch) -> dict:
    """A directory laid out like the project, holding the 4B recipe and the real 4B config;
    returns its params (the working directory is it)."""
    from stages.lib.params import load

    shutil.copy(REPO / "recipes" / "gemma3-4b-v6e-8.yaml", tmp_path / "params.yaml")
    with_real_4b_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    return load()


@pytest.fixture(scope="session")
def tiny_run(workspace, tmp_path_factory) -> SimpleNamespace:
    """The tiny recipe run once with `dvc repro`, with a canary HF token in the environment, and
    MaxText's profiler on for two steps (a runtime setting: tests/test_profile.py reads the
    trace; test_faults.py's run, without it, must end with the same weights). Read-only for
    tests: clone it to change it."""

    def build() -> dict:
        root = workspace("tiny-run")
        set_param(root, "runtime.profile_steps", 2)
        commit(root, "profile two steps")
        run = run_pipeline(root, HF_TOKEN=CANARY_TOKEN)
        return {
            "path": str(run.path),
            "output": run.output,
            "seconds": run.seconds,
            "seen_commands": sorted(run.watch.seen_commands),
            "leaks": run.watch.leaks,
        }

    run = built_once(tmp_path_factory, "tiny-run", build)
    return SimpleNamespace(
        path=Path(run["path"]),
        output=run["output"],
        seconds=run["seconds"],
        watch=SimpleNamespace(seen_commands=set(run["seen_commands"]), leaks=run["leaks"]),
    )


@pytest.fixture(scope="session")
def small_run(workspace, tmp_path_factory) -> SimpleNamespace:
    """The small recipe (the real Gemma 3 270M) run once with `dvc repro`: the suite's only
    real-model MaxText processes, all in tests/test_small.py on one worker, so two of them
    (~13 GB each) never run at once. Read-only for tests: clone it to change it."""

    def build() -> dict:
        run = run_pipeline(workspace("small-run", recipe="small"))
        return {"path": str(run.path), "output": run.output, "seconds": run.seconds}

    run = built_once(tmp_path_factory, "small-run", build)
    return SimpleNamespace(path=Path(run["path"]), output=run["output"], seconds=run["seconds"])


@pytest.fixture
def clone_of_tiny_run(tiny_run, tmp_path) -> Path:
    return clone_workspace(tiny_run, tmp_path)


@pytest.fixture(scope="session")
def experiments(tiny_run, tmp_path_factory) -> SimpleNamespace:
    """A clone of the tiny run in which GRID was queued and run: root, what tools.grid said
    (`queued`), the queue's final status, and each experiment's output (`dvc queue logs`)."""
    root = clone_workspace(tiny_run, tmp_path_factory.mktemp("exps"))
    queued = sh([sys.executable, "-m", "tools.grid", *GRID], root).stdout
    status = run_queue(root, EXPERIMENTS)
    logs = {name: sh(["dvc", "queue", "logs", name], root).stdout for name in EXPERIMENTS}
    return SimpleNamespace(
        root=root, queued=queued, status=status, logs=logs
    )  # (on one worker only: SAME_WORKER above)
