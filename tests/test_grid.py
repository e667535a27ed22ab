"""tools/grid.py: the experiments a grid expands to, their names, their values, the stages they
share; the board its workers share (tools/grid_board.py), against a bare git repository; and
workers on a two-stage stand-in pipeline: a worker killed outright started again and taking its
claim back, a silent worker's variant taken over by another, a failing variant failing alone.
(The real pipeline's grid on two workers, one preempted and its variant resumed on a new VM:
tests/test_experiments.py; refusing a bad grid: tests/test_grid_engines.py, test_bad_input.py.)"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_faults import live_processes, session_pids

from testkit.workspace import commit, copy_project, env, sh
from tools.grid import experiment_name, shared_stages, with_values
from tools.grid_board import SHARED, Board


def test_names_spell_what_each_variant_changes():
    assert experiment_name([("train.learning_rate", "3e-4"), ("train.steps", "80")]) == "lr3e-4-steps80"
    assert experiment_name([("train.lora.enabled", "true"), ("train.learning_rate", "5e-3")]) == "lora-lr5e-3"
    assert experiment_name([("train.lora.enabled", "False")]) == "no-lora"
    assert experiment_name([("benchmark.max_new_tokens", "8")]) == "max-new-tokens8"
    assert experiment_name([("train.lora.module_path", ".*/query")]) == "module-path.--query"  # a valid git ref


def test_values_are_parsed_as_dvc_exp_run_parses_them():
    params = {"train": {"learning_rate": 1e-3, "lora": {"enabled": False}}}
    changed = with_values(params, [("train.learning_rate", "5e-3"), ("train.lora.enabled", "true")])
    assert changed["train"] == {"learning_rate": 5e-3, "lora": {"enabled": True}}  # a float and a bool, not strings
    assert params["train"]["learning_rate"] == 1e-3  # the original untouched


def test_a_grid_shares_the_stages_no_varied_key_reaches():
    # train.* reaches train and everything after it (the SFT model's own pairs, self_pairs, and
    # preference_data, which reads them, among it); what train needs runs once for all.
    assert shared_stages(["train.learning_rate"]) == [
        "base_model", "dataset", "constraints", "token_lengths", "convert_in", "fit_check",
    ]  # fmt: skip
    # A benchmark setting: even the training is shared, only the benchmark runs per variant.
    assert "train" in shared_stages(["benchmark.limit"]) and "benchmark" not in shared_stages(["benchmark.limit"])
    # A whole section named reaches every stage reading a key in it: token_lengths counts with
    # train.chat_rendering, the fit check compiles train.per_device_batch_size's step.
    assert shared_stages(["train"]) == ["base_model", "dataset", "constraints", "convert_in"]


@pytest.fixture
def boards(tmp_path):
    """Two clones of one bare git remote, each a worker's view of grid g1."""
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    clones = []
    for name in ("a", "b"):
        subprocess.run(["git", "clone", "-q", str(remote), str(tmp_path / name)], check=True, capture_output=True)
        clones.append(Board(str(tmp_path / name), "g1"))
    base = clones[0]._commit({"base": True})
    assert clones[0].publish({"variants": {"v1": ["train.steps=1"]}}, base)
    assert not clones[1].publish({"variants": {}}, base)  # the same grid again: its first spec stays
    return clones


def test_a_variant_is_claimed_by_one_worker_only(boards):
    a, b = boards
    held = a.claim("v1", "worker-a")
    assert held and b.claim("v1", "worker-b") is None  # b was second
    state = b.refresh()
    assert b.spec() == {"variants": {"v1": ["train.steps=1"]}}
    assert state.of("v1", time.time(), stale_after=60) == "running" and state.claims["v1"].worker == "worker-a"


def test_a_silent_claim_goes_stale_and_is_taken_over_once(boards):
    a, b = boards
    held = a.claim("v1", "worker-a")
    later = time.time() + 120
    state = b.refresh()
    assert state.of("v1", later, stale_after=60) == "stale"
    taken = b.claim("v1", "worker-b", taking_over=state.claims["v1"])
    assert taken and a.claim("v1", "worker-c", taking_over=state.claims["v1"]) is None  # from the same stale claim
    # The silent worker comes back: its heartbeat finds the claim gone and says so; its release
    # leaves the new holder's claim alone.
    assert a.heartbeat("v1", held) is None
    a.release("v1", held)
    assert b.refresh().claims["v1"].worker == "worker-b"
    assert b.heartbeat("v1", taken).sha != taken.sha


def test_outcomes_outlive_the_claim_and_failures_can_be_retried(boards):
    a, b = boards
    held = a.claim("v1", "worker-a")
    a.finish("v1", "failed", {"worker": "worker-a", "line": "train: error: out of memory"})
    a.release("v1", held)
    state = b.refresh()
    assert state.of("v1", time.time(), 60) == "failed" and state.failed["v1"].info["line"].endswith("out of memory")
    assert "v1" not in state.claims
    b.forget_failure("v1")
    assert b.refresh().of("v1", time.time(), 60) == "queued"
    assert b.grids() == ["g1"]


# A pipeline of two quick stages standing in for the real one: the board, the workers and DVC
# are real, the training is a sleep. train.steps=13 fails, as a bad value or an OOM would.
TOY_PIPELINE = {
    "stages": {
        "prep": {
            "cmd": "python -c \"open('prep.txt', 'w').write('prep')\"",
            "params": ["model.maxtext_name"],
            "outs": ["prep.txt"],
        },
        "train": {
            "cmd": "python -c \"import json, sys, time, yaml; t = yaml.safe_load(open('params.yaml'))['train']; "
            "time.sleep(6); t['steps'] != 13 or sys.exit('train: error: out of memory at step 13'); "
            "json.dump({'loss': t['learning_rate'] * t['steps']}, open('m.json', 'w'))\"",
            "deps": ["prep.txt"],
            "params": ["train.learning_rate", "train.steps"],
            "metrics": [{"m.json": {"cache": False}}],
        },
    }
}


def start_toy_grid(tmp_path: Path, axes: list[str], workers: int, stale_after: int) -> tuple:
    """TOY_PIPELINE in a fresh copy of the project (a bare git remote, a local DVC remote) and
    `python -m tools.grid AXES --on local:WORKERS` started on it, in a session of its own.
    Returns the project, its git remote, the tool's process, the grid's id, the tool's output."""
    root = copy_project(tmp_path / "user")
    (root / "dvc.yaml").write_text(yaml.safe_dump(TOY_PIPELINE, sort_keys=False))
    commit(root, "the toy pipeline")
    origin = tmp_path / "origin.git"
    sh(["git", "init", "-q", "--bare", str(origin)], tmp_path)
    sh(["git", "remote", "add", "origin", str(origin)], root)
    sh(["dvc", "remote", "modify", "--local", "gcs", "url", str(tmp_path / "dvc-remote")], root)
    said = tmp_path / "grid.log"
    with open(said, "w") as out:
        tool = subprocess.Popen(
            [sys.executable, "-m", "tools.grid", *axes, "--on", f"local:{workers}", "--heartbeat", "1"]
            + ["--stale-after", str(stale_after), "--poll", "1"],
            cwd=root, env=env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    grid_id = wait_for(lambda: re.search(r"^grid (\w+): ", said.read_text(), re.M), said).group(1)
    return root, origin, tool, grid_id, said


def worker_pid(grid_id: str, name: str) -> int:
    """The pid of grid `grid_id`'s worker `name` (tests/conftest.py's grid uses it too)."""
    mine = f"--grid={grid_id} --worker={name} "  # (not another grid's worker of the same name)
    (pid,) = [p for p, cmd in live_processes().items() if "tools.grid_worker" in cmd and mine in cmd]
    return pid


@pytest.mark.slow
def test_a_worker_killed_outright_is_started_again_and_takes_its_claim_back(tmp_path):
    root, _, tool, grid_id, said = start_toy_grid(tmp_path, ["train.learning_rate=1e-3,5e-3"], 1, stale_after=60)
    board = Board(str(root), grid_id)
    held = wait_for(lambda: [v for v, c in board.refresh().claims.items() if v != SHARED], said)
    for pid in session_pids(worker_pid(grid_id, "local-1")):  # it and all it started: no claim given back
        os.kill(pid, signal.SIGKILL)
    assert tool.wait(timeout=120) == 0, said.read_text()[-3000:]
    assert "grid: worker local-1 killed (signal 9); starting it again" in said.read_text()
    log = (root / ".dvc" / "tmp" / "grid" / grid_id / "local-1.log").read_text()
    # At once, not after stale_after: the claim is this worker's own.
    assert f"{held[0]}: started (taken over: its own claim from before a restart" in log, log[-3000:]
    status = sh([sys.executable, "-m", "tools.grid", "status", grid_id], root).stdout
    assert status.count(" done on local-1") == 3, status  # the shared stage and both variants


@pytest.mark.slow
def test_a_silent_workers_variant_goes_to_another_and_a_failing_one_fails_alone(tmp_path):
    axes = ["train.learning_rate=1e-3,5e-3", "train.steps=10,13"]
    root, origin, tool, grid_id, said = start_toy_grid(tmp_path, axes, 1, stale_after=6)
    board = Board(str(root), grid_id)
    # A second worker, started by hand, in a clone of its own.
    other = subprocess.Popen(
        [sys.executable, "-m", "tools.grid_worker", f"--grid={grid_id}", "--worker=b", f"--dir={tmp_path / 'b'}"]
        + [f"--remote={origin}", f"--dvc-config-local={root / '.dvc' / 'config.local'}"],
        cwd=root, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    # local-1 holds a variant: it, all it started, and the tool that would start it again vanish (a lost VM).
    mine = lambda: [v for v, c in board.refresh().claims.items() if c.worker == "local-1" and v != SHARED]  # noqa: E731
    held = wait_for(mine, said)
    for pid in session_pids(tool.pid) + session_pids(worker_pid(grid_id, "local-1")):
        os.kill(pid, signal.SIGKILL)
    output = other.communicate(timeout=300)[0]
    assert other.returncode == 0, output
    assert f"{held[0]}: started (taken over: from local-1, silent" in output, output
    status = sh([sys.executable, "-m", "tools.grid", "status", grid_id], root).stdout
    names = ["lr1e-3-steps10", "lr1e-3-steps13", "lr5e-3-steps10", "lr5e-3-steps13"]
    for name in names:
        line = next(line for line in status.splitlines() if line.split()[0] == name)
        if name.endswith("steps13"):  # fails alone, with the line that says why
            assert re.search(r"failed on (b|local-1): train: error: out of memory at step 13$", line), status
        else:
            assert " done on " in line, status
    sh([sys.executable, "-m", "tools.grid", "pull", grid_id], root)
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], root).stdout)
    revs = [rev for c in shown for e in c.get("experiments") or [] for rev in e["revs"]]
    exps = {rev["name"]: rev["data"]["metrics"]["m.json"]["data"]["loss"] for rev in revs}
    assert exps == pytest.approx({"lr1e-3-steps10": 0.01, "lr5e-3-steps10": 0.05})


def wait_for(condition, log: Path, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    return found
