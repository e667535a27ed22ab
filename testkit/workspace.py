"""Throw-away copies of the project, and the commands tests and benchmarks run in them.

Tests never touch the checkout they live in. `copy_project` copies the project's files (the
working tree, uncommitted changes included) into a temporary git repository, switched to a
recipe; `run_pipeline` runs `dvc repro` there as a user would. bench/ builds its fresh
workspaces with the same functions (python -m bench.run).
"""

import csv
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import yaml

from testkit.process_watch import ProcessWatch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
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
        raise AssertionError(
            f"{args} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def commit(root: Path, message: str) -> None:
    sh(["git", *GIT_ID, "add", "-A"], root)
    sh(["git", *GIT_ID, "commit", "-q", "--allow-empty", "-m", message], root)


# Results of running the pipeline in the checkout itself (git-tracked by DVC users, but never
# part of a fresh copy of the project).
RUN_RESULTS = ("dvc.lock", "metrics/", "plots/", "eval/", "dvclive/", "dvclive-preference/")


def dry_run_args(stdout: str) -> list[str]:
    """The arguments of the command a stage's --dry-run printed after "would run:" (shell-quoted,
    one argument per continued line), as the shell would pass them."""
    lines = stdout.split("would run:\n", 1)[1].splitlines()
    last = next(i for i, line in enumerate(lines) if not line.endswith("\\"))
    return shlex.split(" ".join(line.removesuffix("\\") for line in lines[: last + 1]))


@functools.cache  # (the checkout does not change during a test run)
def project_files() -> tuple[str, ...]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(f for f in out.split("\0") if f and (REPO / f).is_file() and not f.startswith(RUN_RESULTS))


def copy_project(root: Path, recipe: str = "tiny", compile_cache: Path | None = None) -> Path:
    """The project's files copied into root, switched to `recipe`, committed to a new git
    repository (so DVC experiments work). Also bench/'s fresh workspaces."""
    from tools.recipe import params_text

    for f in project_files():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, root / f)
    # What `python -m tools.recipe RECIPE` writes there (tests/test_recipes.py runs the tool
    # itself), without a Python process of its own for each of the suite's workspaces.
    (root / "params.yaml").write_text(params_text(recipe))
    if compile_cache:
        set_param(root, "runtime.compile_cache_dir", str(compile_cache))
    sh(["git", "init", "-q", "-b", "main"], root)
    commit(root, "project")
    return root


def with_real_4b_config(root: Path) -> Path:
    """models/base-hf as far as the checks and flags need it: google/gemma-3-4b-it's
    config.json and an index naming its tensors in the Hub's layout (no weights)."""
    base = root / "models" / "base-hf"
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text((DATA / "gemma-3-4b-it.config.json").read_text())
    (base / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"language_model.model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})
    )
    return root


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


def clone_workspace(tiny_run, parent: Path, cache: Path | None = None) -> Path:
    """A git clone of tiny_run sharing its DVC cache (or using `cache`), outputs checked out:
    free to modify."""
    root = parent / "clone"
    sh(["git", "clone", "-q", str(tiny_run.path), str(root)], parent)
    sh(["dvc", "cache", "dir", "--local", str(cache or tiny_run.path / ".dvc" / "cache")], root)
    sh(["dvc", "checkout", "-q"], root)
    return root


def flat_params(checkpoint: Path) -> dict:
    """A MaxText checkpoint's parameters as {path/of/array: numpy array}, to compare runs bit for bit."""
    import numpy as np

    from stages.in_maxtext.merge_lora import restore_numpy

    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}/")
            else:
                out[prefix + key] = np.asarray(value)

    walk(restore_numpy(str(checkpoint)), "")
    return out


def sha256s(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


# The suite's experiments: one grid of tools/grid.py, full fine-tuning and LoRA at the
# recipe's rate (1e-3), run by two workers (tests/conftest.py's `experiments`): two
# trainings, each minutes, that every experiment test shares (tests/test_experiments.py,
# tests/test_golden.py). The first is the recipe itself, so it must end as tiny_run did.
# (Two variants, not a product of two axes: each variant costs the suite ~2 minutes of both
# cores; tools.grid's products are tested in tests/test_grid.py.)
GRID = ["train.lora.enabled=false,true"]
EXPERIMENTS = ["no-lora", "lora"]  # the names tools.grid gives them
AS_RECIPE = "no-lora"


def apply(root: Path, name: str) -> None:
    """`dvc exp apply NAME` and the outputs it names checked out, as a user takes an experiment."""
    sh(["dvc", "exp", "apply", name], root)
    sh(["dvc", "checkout", "-q"], root)


def train_losses(root: Path) -> dict[int, str]:
    """{step: loss} as the train stage logged it (DVCLive's file; the loss as written)."""
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
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    set_key(params, dotted, value)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
