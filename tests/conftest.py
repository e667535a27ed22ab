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
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from testkit.built_once import built_once, run_dir
from testkit.gcs_server import client_env, reached, running
from testkit.process_watch import CANARY_TOKEN
from testkit.workspace import (
    AS_RECIPE,
    EXPERIMENTS,
    GRID,
    REPO,
    clone_workspace,
    commit,
    copy_project,
    env,
    run_pipeline,
    set_param,
    sh,
    with_real_4b_config,
)

pytest_plugins = ["testkit.xdist_schedule"]

# Tests that read checkpoints load JAX in this process; keep it off libtpu (installed for the
# fit check), whose lock would otherwise stop every later process that loads it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No test machine is a Google Cloud VM: gcsfs, finding no credentials for a gs:// path, would
# otherwise ask the metadata server for a VM's, with retries (14 s a first gs:// filesystem,
# measured), before falling back to anonymous access. Tests that reach a bucket reach the
# emulator with its own client environment (testkit/gcs_server.py).
os.environ.setdefault("NO_GCE_CHECK", "true")


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
        root = workspace("small-run", recipe="small")
        set_param(root, "gguf.types", ["q8_0"])  # (the suite's time: f16 is checked on the tiny models)
        # (And the benchmark on the first 16 items of each task, of 40 and 32: each scoring item is
        # four forward passes of the 270M per model, ~0.6 s each on 2 cores.)
        set_param(root, "benchmark.limit", 16)
        # (evaluate computes the held-out losses here. Taken from training's own evaluations at
        # steps 0 and 20 instead, train took 467 s beside the other worker, its two evaluations
        # 112 s of it, against evaluate's 85 s: no saving, 2026-12-06.)
        commit(root, "one GGUF type, 16 benchmark items a task")
        run = run_pipeline(root)
        return {"path": str(run.path), "output": run.output, "seconds": run.seconds}

    run = built_once(tmp_path_factory, "small-run", build)
    return SimpleNamespace(path=Path(run["path"]), output=run["output"], seconds=run["seconds"])


@pytest.fixture
def clone_of_tiny_run(tiny_run, tmp_path) -> Path:
    return clone_workspace(tiny_run, tmp_path)


@pytest.fixture(scope="session")
def experiments(workspace, tmp_path_factory) -> SimpleNamespace:
    """GRID run past one machine, as a team runs a sweep (docs/sweeps.md): `python -m tools.grid
    GRID --on local:2` in the user's fresh copy of the project (no dvc.lock: nothing run yet;
    its benchmark on 2 items a task and one prompt: no experiment test reads it),
    two workers in clones of their own, a bare git repository as the git remote, fake-gcs-server
    as the DVC remote, as runtime.scratch_dir and as the JAX compilation cache. Once AS_RECIPE's
    training has checkpoint 20 on gs://, the spot VM its worker runs on is taken back: SIGTERM
    to everything on it (its preemption notice); the worker gives its claim back. A new VM
    joins: one more worker started by hand, in a fresh clone of its own, which takes the
    variant and resumes it. The tool ends by pulling every experiment into the user's clone
    (`pull --outputs`: weights too).

    root: the user's clone; said: the tool's output; grid_id; clones: {worker: its clone};
    logs: {variant: {worker: its output there, every attempt}}; worker_logs: {worker: its
    whole output}; preempted: the preempted worker's name; origin: the git remote; server and
    cloud: the GCS emulator and its client environment. Training evaluates at its first and
    last step (train.eval_interval 40). (On one pytest worker only: SAME_WORKER.)"""
    root = workspace("grid-user")
    bucket = "grid"
    with running(tmp_path_factory.mktemp("grid-gcs"), bucket) as server:
        yield run_grid(root, server, bucket, tmp_path_factory)


def wait_until(proc: subprocess.Popen, log: Path, condition, every: float = 2, timeout: float = 1800):
    """Polls `condition` until it returns something true, while `proc` runs."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before it was seen:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"not seen after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(every)
    return found


def run_grid(root: Path, server, bucket: str, tmp_path_factory) -> SimpleNamespace:
    """experiments' run (above), the GCS server given."""
    from test_faults import session_pids, wait_for_session_to_end
    from test_grid import worker_pid

    cloud = client_env(server)
    set_param(root, "runtime.scratch_dir", f"gs://{bucket}/scratch")  # a variant resumes on any machine
    set_param(root, "runtime.keep_scratch", True)  # a finished variant's final checkpoint stays there too
    # What one machine compiled, the next reads (JAX_LOG_COMPILES, below: JAX then logs each hit).
    set_param(root, "runtime.compile_cache_dir", f"gs://{bucket}/jax-cache")
    set_param(root, "runtime.profile_steps", 0)  # (JAX's own GCS client cannot reach the emulator)
    # Held-out losses from training's own evaluations, at its first and last step (as the TPU
    # recipes do): the preempted variant's curve continues on the new VM, and evaluate takes
    # them where tiny_run's computes them, on the same weights (tests/test_experiments.py).
    set_param(root, "train.eval_interval", 40)
    set_param(root, "runtime.data_workers", 1)  # (in-training evaluations need grain's worker)
    set_param(root, "benchmark.limit", 2)  # (the suite's time: the benchmark's scores are not what is tested)
    set_param(root, "benchmark.prompts", ["What is 17 plus 25?"])
    set_param(root, "gguf.types", [])  # (no experiment test reads a GGUF: tiny_run and the families check them)
    commit(root, "scratch and compilation cache on gs://")
    origin = tmp_path_factory.mktemp("grid-git") / "project.git"
    sh(["git", "init", "-q", "--bare", "-b", "main", str(origin)], origin.parent)
    sh(["git", "remote", "add", "origin", str(origin)], root)
    sh(["git", "push", "-q", "origin", "main"], root)
    server.remote_config(root, bucket, "dvc")
    said_path = root.parent / "grid.log"
    with open(said_path, "w") as said:
        tool = subprocess.Popen(
            [sys.executable, "-m", "tools.grid", *GRID, "--on", "local:2", "--heartbeat", "5", "--stale-after", "60"]
            + ["--poll", "5"],
            cwd=root,
            env=env(**cloud, JAX_LOG_COMPILES="1"),
            stdout=said,
            stderr=subprocess.STDOUT,
        )
    grid_id = wait_until(tool, said_path, lambda: re.search(r"^grid (\w+): ", said_path.read_text(), re.M)).group(1)
    clones = {f"local-{i}": root / ".dvc" / "tmp" / "grid" / grid_id / f"local-{i}" for i in (1, 2)}
    worker_log_paths = {w: root / ".dvc" / "tmp" / "grid" / grid_id / f"{w}.log" for w in clones}

    def variant_log(worker: str, variant: str) -> Path:
        return clones[worker] / ".dvc" / "tmp" / "grid-logs" / f"{variant}.log"

    def training_it() -> tuple[str, str] | None:
        for worker in clones:
            log = variant_log(worker, AS_RECIPE)
            if found := log.exists() and re.search(rf"working directory gs://{bucket}/(\S+)", log.read_text()):
                return worker, found.group(1)
        return None

    preempted, workdir = wait_until(tool, said_path, training_it, every=1)
    wait_until(tool, said_path, lambda: reached(server, 20, bucket, workdir + "/"), every=1)
    pid = worker_pid(grid_id, preempted)
    for member in session_pids(pid):  # the worker started in a session of its own: it, DVC, the stage, MaxText
        os.kill(member, signal.SIGTERM)
    wait_for_session_to_end(pid)
    # A new VM: nothing of the old one but the git remote and the bucket.
    clones["vm-2"] = tmp_path_factory.mktemp("grid-vm-2") / "clone"
    worker_log_paths["vm-2"] = clones["vm-2"].parent / "vm-2.log"
    with open(worker_log_paths["vm-2"], "w") as out:
        joined = subprocess.Popen(
            [sys.executable, "-m", "tools.grid_worker", f"--grid={grid_id}", "--worker=vm-2"]
            + [f"--dir={clones['vm-2']}", f"--remote={origin}", f"--dvc-config-local={root / '.dvc' / 'config.local'}"],
            cwd=root,
            env=env(**cloud, JAX_LOG_COMPILES="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    assert tool.wait(timeout=2400) == 0, said_path.read_text()[-6000:]
    assert joined.wait(timeout=600) == 0, worker_log_paths["vm-2"].read_text()[-6000:]
    sh([sys.executable, "-m", "tools.grid", "pull", grid_id, "--outputs"], root, **cloud)  # the weights too
    logs = {v: {w: variant_log(w, v).read_text() for w in clones if variant_log(w, v).exists()} for v in EXPERIMENTS}
    return SimpleNamespace(
        root=root,
        said=said_path.read_text(),
        grid_id=grid_id,
        clones=clones,
        logs=logs,
        worker_logs={w: path.read_text() for w, path in worker_log_paths.items()},
        preempted=preempted,
        origin=origin,
        server=server,
        cloud=cloud,
    )
