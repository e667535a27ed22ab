"""Shared fixtures: throw-away copies of the project that run the real pipeline.

scripts/test.sh runs two pytest-xdist workers (a pipeline test spends much of its time in
single-threaded work: imports, DVC, Python loops, so two share the 2 cores well). The
session's expensive fixtures are built once per test run, by the first worker that needs
them, and read by the other (`built_once`); each test file runs whole on one worker, the
longest files first (`pytest_xdist_make_scheduler`, `pytest_collection_modifyitems`).

Tests never touch the checkout they live in. `workspace()` copies the project's files (the
working tree, uncommitted changes included) into a temporary git repository, switched to the
tiny recipe. The expensive fixture, `tiny_run`, runs `dvc repro` once per session; tests
that need a variant clone it (`clone_of_tiny_run`) and share its DVC cache, so only the
stages the variant changes run again. Every workspace, and every experiment DVC queues from
one, points `runtime.compile_cache_dir` at one JAX compilation cache for the session, so a
train step compiled once is compiled never again.

    scripts/test.sh -m "not slow"     # the fast layer: pure logic, in-process (~1.5 minutes)
    scripts/test.sh                   # everything, real pipeline runs included
"""

import hashlib
import json
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
DATA = Path(__file__).parent / "data"
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


def commit(root: Path, message: str) -> None:
    sh(["git", *GIT_ID, "add", "-A"], root)
    sh(["git", *GIT_ID, "commit", "-q", "--allow-empty", "-m", message], root)


# Results of running the pipeline in the checkout itself (git-tracked by DVC users, but never
# part of a fresh copy of the project).
RUN_RESULTS = ("dvc.lock", "metrics/", "plots/", "eval/", "dvclive/")


def project_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and (REPO / f).is_file() and not f.startswith(RUN_RESULTS)]


def copy_project(root: Path, recipe: str = "tiny", compile_cache: Path | None = None) -> Path:
    """The project's files copied into root, switched to `recipe`, committed to a new git
    repository (so DVC experiments work). Also bench/'s fresh workspaces."""
    for f in project_files():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, root / f)
    sh([sys.executable, "-m", "tools.recipe", recipe], root)
    if compile_cache:
        set_param(root, "runtime.compile_cache_dir", str(compile_cache))
    sh(["git", "init", "-q", "-b", "main"], root)
    commit(root, "project")
    return root


# Files whose tests change a shared fixture run on one worker: both `dvc exp apply` in the
# experiments' workspace; the others run commands in tiny_run's own workspace (DVC's lock
# is per workspace) or read every file in it.
SAME_WORKER = {"test_golden.py": "test_experiments.py",
               **dict.fromkeys(["test_plots.py", "test_publish.py", "test_export.py", "test_secrets.py"], "test_pipeline.py")}
# The longest files first (minutes, measured), so that the two workers end together. The
# second needs no tiny_run: it runs while the first worker builds it.
LONGEST_FIRST = ["test_small.py", "test_faults.py", "test_tpu_recipe.py", "test_experiments.py", "test_multihost.py",
                 "test_remote.py", "test_pipeline.py", "test_spot.py", "test_tiny_family_runs_the_whole_pipeline",
                 "test_roundtrip.py"]


# Tests that share nothing with the rest of their file and each run a whole pipeline: each
# is a unit of its own, so that either worker takes the next one.
OWN_UNIT = ("test_tiny_family_runs_the_whole_pipeline[",)


def file_group(path_or_nodeid: str) -> str:
    """The unit one worker runs whole: a test file, or the files it shares a worker with."""
    path, _, test = str(path_or_nodeid).partition("::")
    if test.startswith(OWN_UNIT):
        return test
    name = path.rsplit("/", 1)[-1]
    return SAME_WORKER.get(name, name)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: the rest in file order
    items.sort(key=lambda item: rank.get(file_group(item.nodeid).split("[", 1)[0], len(rank)))


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope`, with a file (or its SAME_WORKER group) as the scope. (Not
    `--dist loadgroup` with marks: with pytest 9.2 it silently stops grouping,
    pytest-dev/pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return file_group(nodeid)

        def _reschedule(self, node) -> None:
            # xdist hands a worker its next unit while the worker still has two tests to run;
            # with tests of minutes that bound two more pipeline files to one busy worker
            # while the other ran out of work (a 4-minute tail, measured). One pending test
            # is the least that keeps a worker going: it runs a test only once it knows the next.
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return ByFile(config, log)


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
    from stages.lib.families import gemma3

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


def with_real_4b_config(root: Path) -> Path:
    """models/base-hf as far as the checks and flags need it: google/gemma-3-4b-it's
    config.json and an index naming its tensors in the Hub's layout (no weights)."""
    import json

    base = root / "models" / "base-hf"
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text((DATA / "gemma-3-4b-it.config.json").read_text())
    (base / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"language_model.model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    return root


# A Hugging Face token that must never be written anywhere or passed on a command line. Made
# up per test run (the same in every worker: one may check what another's run wrote), so
# that no file (this one included) can contain it by accident.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID")
CANARY_TOKEN = "hf_canary" + (hashlib.sha256(_RUN_ID.encode()).hexdigest()[:32] if _RUN_ID else secrets.token_hex(16))


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
                    if "stages." not in argv and "tools." not in argv:
                        continue
                    self.seen_commands.add(argv)
                    if CANARY_TOKEN in argv:
                        self.leaks.append(f"argv of {argv[:120]}")
                    if "maxtext_main" in argv and CANARY_TOKEN.encode() in (proc / "environ").read_bytes():
                        self.leaks.append(f"environment of {argv[:120]}")
                except OSError:
                    continue  # the process ended between listing and reading


def run_pipeline(root: Path, *args: str, **env_extra) -> SimpleNamespace:
    """`dvc repro` in root, results committed to its git repo like a user would."""
    watch = ProcessWatch()
    watch.start()
    try:
        proc = sh(["dvc", "repro", *args], root, **env_extra)
    finally:
        watch.stop_event.set()
        watch.join()
    commit(root, "dvc repro")
    return SimpleNamespace(path=root, output=proc.stdout + proc.stderr, seconds=proc.elapsed, watch=watch)


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
        return {"path": str(run.path), "output": run.output, "seconds": run.seconds,
                "seen_commands": sorted(run.watch.seen_commands), "leaks": run.watch.leaks}

    run = built_once(tmp_path_factory, "tiny-run", build)
    return SimpleNamespace(path=Path(run["path"]), output=run["output"], seconds=run["seconds"],
                           watch=SimpleNamespace(seen_commands=set(run["seen_commands"]), leaks=run["leaks"]))


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


def clone_workspace(tiny_run, parent: Path, cache: Path | None = None) -> Path:
    """A git clone of tiny_run sharing its DVC cache (or using `cache`), outputs checked out:
    free to modify."""
    root = parent / "clone"
    sh(["git", "clone", "-q", str(tiny_run.path), str(root)], parent)
    sh(["dvc", "cache", "dir", "--local", str(cache or tiny_run.path / ".dvc" / "cache")], root)
    sh(["dvc", "checkout", "-q"], root)
    return root


@pytest.fixture
def clone_of_tiny_run(tiny_run, tmp_path) -> Path:
    return clone_workspace(tiny_run, tmp_path)


def sha256s(directory: Path) -> dict:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


# The suite's experiments: one grid queued with tools/grid.py, LoRA and full fine-tuning at
# 5e-3 (the recipe's rate is 1e-3): two trainings, each minutes, that every experiment test
# shares (tests/test_experiments.py, tests/test_golden.py).
GRID = ["train.lora.enabled=true,false", "train.learning_rate=5e-3"]
EXPERIMENTS = ["lora-lr5e-3", "no-lora-lr5e-3"]  # the names tools.grid gives them


def run_queue(root: Path, names: list[str], timeout: float = 1800) -> str:
    """`dvc queue start` with one worker, waited out; returns the last `dvc queue status`.
    Waits on git: each experiment that ends well leaves a ref (refs/exps/.../NAME), which
    costs nothing to look at, while `dvc queue status` costs ~3 CPU-seconds (it asks the
    celery worker): asked once a minute (a failed experiment leaves no ref), and at the end."""
    sh(["dvc", "queue", "start", "--jobs", "1"], root)
    deadline = time.monotonic() + timeout
    asked = time.monotonic()
    while True:
        refs = sh(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], root).stdout.split()
        if all(any(ref.endswith("/" + name) for ref in refs) for name in names) or time.monotonic() - asked > 60:
            status = sh(["dvc", "queue", "status"], root).stdout
            if not any(word in status for word in ("Queued", "Running")):
                return status
            asked = time.monotonic()
        assert time.monotonic() < deadline, sh(["dvc", "queue", "status"], root).stdout
        time.sleep(2)


@pytest.fixture(scope="session")
def experiments(tiny_run, tmp_path_factory) -> SimpleNamespace:
    """A clone of the tiny run in which GRID was queued and run: root, what tools.grid said
    (`queued`), the queue's final status, and each experiment's output (`dvc queue logs`)."""
    root = clone_workspace(tiny_run, tmp_path_factory.mktemp("exps"))
    queued = sh([sys.executable, "-m", "tools.grid", *GRID], root).stdout
    status = run_queue(root, EXPERIMENTS)
    logs = {name: sh(["dvc", "queue", "logs", name], root).stdout for name in EXPERIMENTS}
    return SimpleNamespace(root=root, queued=queued, status=status, logs=logs)  # (on one worker only: SAME_WORKER above)


def apply(root: Path, name: str) -> None:
    """`dvc exp apply NAME` and the outputs it names checked out, as a user takes an experiment."""
    sh(["dvc", "exp", "apply", name], root)
    sh(["dvc", "checkout", "-q"], root)


def train_losses(root: Path) -> dict[int, str]:
    """{step: loss} as the train stage logged it (DVCLive's file; the loss as written)."""
    import csv

    with open(root / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv") as f:
        return {int(row["step"]): row["loss"] for row in csv.DictReader(f, delimiter="\t")}


def stages_run(output: str) -> list[str]:
    """Names of the stages a `dvc repro` output says it ran."""
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


class _Delete:
    def __repr__(self) -> str:  # in test ids: the same in every pytest-xdist worker
        return "<deleted>"


DELETE = _Delete()  # as a value for set_key: remove the key


def set_key(params: dict, dotted: str, value) -> None:
    """Sets (or, with DELETE, removes) one key of a params dict in place: "train.steps"."""
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value


def set_param(root: Path, dotted: str, value) -> None:
    """Edits one key of root's params.yaml: set_param(root, "train.steps", 60)."""
    import yaml

    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    set_key(params, dotted, value)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
