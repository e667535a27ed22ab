"""Nothing lost, nothing wrong: training killed for memory, then stopped by a full disk while a
checkpoint is being written, resumes from its last whole checkpoint each time, DVCLive's curve
holding every run's steps (a run killed between checkpoints on a preempted VM, resumed on
another and ending bit-identical to an uninterrupted run, with its held-out curve and
evaluate's reuse of it: the suite's grid, tests/test_experiments.py; only DVC killed, the stage,
MaxText and its data worker following it, while a second `dvc repro` is refused: the small
recipe's golden-curve test, tests/test_small.py); conversions killed mid-write never leave an
output DVC could take as complete; full disks under an export and a pull are one line each.
(Two runs of the recipe from scratch agreeing: the grid's, whose shared stages run from
nothing, and tiny_run.)"""

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

from testkit import machine_faults
from testkit.workspace import clone_workspace, commit, env, set_param, sh, stages_run, train_losses

pytestmark = pytest.mark.slow


class Repro:
    """`dvc repro ...` running in the background in its own session, to be killed."""

    def __init__(self, root: Path, *args: str, name: str = "repro", **env_extra: str):
        self.root = root
        self.log_path = root.parent / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            ["dvc", "repro", *args],
            cwd=root,
            env=env(**env_extra),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, condition, what: str, timeout: float = 900, every: float = 0.2):
        """Polls `condition` every `every` seconds. Each poll costs the CPU the run under test
        needs, so only a moment that lasts about a second (a checkpoint mid-write, for the tiny
        model) is polled for every 10 ms."""
        deadline = time.monotonic() + timeout
        while not (found := condition()):
            assert self.proc.poll() is None, f"dvc repro ended before {what}:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{self.output()[-4000:]}"
            time.sleep(every)
        return found

    def kill(self, sig: int, whole_group: bool = True) -> None:
        """whole_group: as a preemption or Ctrl-C would; else only DVC itself (a lost SSH session)."""
        if whole_group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        wait_for_session_to_end(self.proc.pid)

    def finish(self, timeout: float = 1800) -> str:
        assert self.proc.wait(timeout=timeout) == 0, self.output()[-6000:]
        return self.output()


def live_processes() -> dict[int, str]:
    """{pid: command line} of every live process (zombies waiting to be reaped have finished)."""
    out = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ProcessLookupError):
            continue
    return out


def session_pids(sid: int) -> list[int]:
    pids = []
    for pid in live_processes():
        try:
            if os.getsid(pid) == sid:
                pids.append(pid)
        except ProcessLookupError:
            continue
    return pids


def session_members(sid: int) -> list[str]:
    """The live processes of a session."""
    commands = live_processes()
    return [commands.get(pid, "")[:160] for pid in session_pids(sid)]


def wait_for_session_to_end(sid: int, timeout: float = 60) -> None:
    """Every process the killed `dvc repro` started is gone: nothing trains on as an orphan."""
    deadline = time.monotonic() + timeout
    while members := session_members(sid):
        assert time.monotonic() < deadline, f"still running {timeout} s after the kill: {members}"
        time.sleep(0.2)


def live_steps(root: Path) -> list[int]:
    try:
        return sorted(train_losses(root))
    except (OSError, ValueError, KeyError):
        return []  # not written yet, or a row being written


def output_hashes(root: Path) -> dict:
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}


@pytest.mark.skipif(bool(machine_faults.unavailable()), reason=str(machine_faults.unavailable()))
def test_training_killed_for_memory_then_stopped_by_a_full_disk_resumes_each_time(clone_of_tiny_run, tmp_path):
    """In a clone of tiny_run, a short training whose checkpoints go to a small disk of their own:
    1. the kernel's out-of-memory killer ends MaxText (its cgroup's limit lowered under it, the
       rest filled, as another job on the VM would): one line with what it held and what to
       change; with the change made (remat_policy full: not part of what the checkpoints are),
       2. `dvc repro` resumes; then the disk fills under it (MaxText 0.2.5 would wait forever on
       the failed save): one line naming the path and the space a checkpoint needs, nothing
       published; 3. with the space freed, `dvc repro` resumes from the last whole checkpoint
       (the half-written one discarded) and finishes, DVCLive's curve holding the steps of all
       three runs, and its working directory gone."""
    root = clone_of_tiny_run
    for curve in (root / "dvclive" / "plots" / "metrics").rglob("*.tsv"):
        curve.unlink()  # tiny_run's own: every step this test reads is this run's
    disk = tmp_path / "disk"
    settings = {"train.steps": 12, "train.checkpoint_period": 4, "train.eval_interval": 0}
    settings |= {"runtime.profile_steps": 0, "runtime.keep_checkpoints": 2, "runtime.scratch_dir": str(disk)}
    for key, value in {**settings, "train.remat_policy": "minimal"}.items():
        set_param(root, key, value)
    commit(root, "a short training, its checkpoints on a small disk, remat minimal")

    def steps_on_disk() -> list[str]:
        found = next(disk.glob("train-*/sft/checkpoints"), None)
        return sorted(p.name for p in found.iterdir()) if found else []

    def failure(run: Repro) -> str:
        assert run.proc.wait(timeout=300) != 0, run.output()[-3000:]
        said = [ln for ln in run.output().splitlines() if ln.startswith("train: failed:")]
        assert len(said) == 1, run.output()[-3000:]
        assert not (root / "models" / "sft-maxtext").exists()
        return said[0]

    def log_end() -> str:  # (for an assertion's message: what MaxText said last)
        return (root / "logs" / "train.log").read_text(errors="replace")[-6000:]

    # (a tiny checkpoint is ~0.35 GB; the stage asks for room for keep_checkpoints + 1 before it starts)
    with machine_faults.small_disk(disk, 1300), machine_faults.memory_group() as group:
        run = Repro(root, "train", name="oom")
        group.add(run.proc.pid)  # before DVC starts the stage: MaxText is born in the group
        run.wait_for(lambda: "4" in steps_on_disk(), "checkpoint 4")
        # The first save is checkpoint_period's, not Orbax's initial one at step 1 (stages/in_maxtext/main.py).
        assert [n for n in steps_on_disk() if n.isdigit()] == ["4"], steps_on_disk()
        balloon = group.squeeze()
        said = failure(run)
        balloon.wait(timeout=60)
        assert group.oom_kills() >= 1
        assert "was killed by the kernel for lack of memory" in said and "GB resident when last read" in said, said
        assert "set train.remat_policy: full (now minimal): the run resumes from its last checkpoint" in said, said
        assert "lower train.per_device_batch_size (now " in said and "train.max_target_length (now " in said, said
        last = max(int(n) for n in steps_on_disk() if n.isdigit())

        set_param(root, "train.remat_policy", "full")
        commit(root, "remat full, as the failure said")
        run = Repro(root, "train", name="disk-full")
        run.wait_for(lambda: f"train: resuming at step {last}:" in run.output(), f"a resume at step {last}")
        run.wait_for(lambda: str(last + 4) in steps_on_disk(), f"checkpoint {last + 4}")
        # Room left for the steps' metrics lines (a few hundred bytes each), not for a checkpoint:
        # the next save is what meets the full disk. (Filled to the last byte, the disk failed a
        # metrics line first in one run of the suite: MaxText then exits by itself,
        # tests/test_full_disk.py.)
        filler = machine_faults.fill(disk, leave_bytes=4 << 20)
        said = failure(run)
        assert "ran out of disk space after" in said and f"writing {disk}/train-" in said, said + "\n" + log_end()
        assert re.search(r"A checkpoint needs ~0\.\d\d GB, 3 at once", said) and "`dvc repro` resumes" in said, said
        half_written = [n for n in steps_on_disk() if not n.isdigit()]
        assert half_written, steps_on_disk()  # the save it stopped

        filler.unlink()
        proc = sh(["dvc", "repro", "train"], root)
        assert f"train: resuming at step {last + 4}:" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
        assert not list(disk.glob("train-*")), "the working directory is deleted after a successful run"
    # Every step of the three runs. (A kill can lose the metrics line of the step its checkpoint
    # was written at, not the step's training: MaxText may save before it logs, and the next
    # run resumes after it.)
    logged = set(live_steps(root))
    assert set(range(1, 13)) - {last, last + 4} <= logged and max(logged) == 12, sorted(logged)
    assert json.loads((root / "dvclive" / "metrics.json").read_text())["run"]["steps"] == 12
    assert json.loads(sh(["dvc", "status", "--json", "train"], root).stdout) == {}


def cache_files(root: Path) -> set[str]:
    cache = Path(sh(["dvc", "cache", "dir"], root).stdout.strip())
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()}


@pytest.fixture
def clone_with_its_own_cache(tiny_run, tmp_path) -> Path:
    """A clone of tiny_run whose DVC cache is its own (hard links to tiny_run's objects and
    run-cache): what the test finds added to it, only this clone's runs can have added
    (the other worker's runs write into tiny_run's cache meanwhile)."""
    shared, cache = tiny_run.path / ".dvc" / "cache", tmp_path / "cache"
    for path in list(shared.rglob("*")):
        target = cache / path.relative_to(shared)
        try:
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, target)
        except FileNotFoundError:
            continue  # a temporary file of a run writing there
    return clone_workspace(tiny_run, tmp_path, cache=cache)


@pytest.mark.parametrize("stage,out", [("convert_in", "models/base-maxtext"), ("convert_out", "models/sft-hf")])
def test_conversion_killed_mid_write_caches_nothing_partial(clone_with_its_own_cache, stage, out):
    root = clone_with_its_own_cache
    lock_before = yaml.safe_load((root / "dvc.lock").read_text())
    cached_before = cache_files(root)
    parent, name = (root / out).parent, (root / out).name

    def partly_written():
        return any(p.is_file() for staged in parent.glob(f".{name}.tmp-*") for p in staged.rglob("*"))

    run = Repro(root, "--force", "--single-item", stage, name=f"kill-{stage}")
    run.wait_for(partly_written, f"{stage} writing its output", every=0.01)
    run.kill(signal.SIGKILL)
    assert not (root / out).exists()  # DVC removed the old output; the partial one is not in its place
    assert cache_files(root) == cached_before, "a killed stage added to the DVC cache"
    assert yaml.safe_load((root / "dvc.lock").read_text()) == lock_before
    status = json.loads(sh(["dvc", "status", "--json", stage], root).stdout)
    assert status, "dvc status must report the missing output"

    # The re-run: DVC's run-cache already holds this stage's complete output for these inputs,
    # so it is restored rather than recomputed; either way it must be the original, whole.
    output = sh(["dvc", "repro", stage], root).stdout
    assert stages_run(output) == [stage] or f"Stage '{stage}' is cached - skipping run" in output, output
    lock_after = yaml.safe_load((root / "dvc.lock").read_text())
    assert lock_after["stages"][stage]["outs"] == lock_before["stages"][stage]["outs"]
    assert json.loads(sh(["dvc", "status", "--json"], root).stdout) == {}
    assert cache_files(root) == cached_before


@pytest.mark.skipif(bool(machine_faults.unavailable()), reason=str(machine_faults.unavailable()))
def test_a_full_disk_under_convert_out_is_one_line_and_leaves_no_export(clone_with_its_own_cache, tmp_path):
    """models/ on a small disk of its own (the outputs before it links into the cache), filled
    while MaxText writes the export's shards: one line with the path, nothing in models/ that
    DVC or a later stage could take for an export; once the space is freed, `dvc repro` ends
    with the export whole."""
    root = clone_with_its_own_cache
    lock_before = yaml.safe_load((root / "dvc.lock").read_text())
    models = root / "models"
    with machine_faults.small_disk(models, 400):
        sh(["dvc", "checkout", "-q"], root)  # (onto the new filesystem: links into the cache, no room taken)
        run = Repro(root, "--force", "--single-item", "convert_out", name="full-convert-out")
        run.wait_for(lambda: any(p.is_file() for p in models.glob(".sft-hf.tmp-*/*")), "the export being written")
        filler = machine_faults.fill(models)
        assert run.proc.wait(timeout=300) != 0
        said = [ln for ln in run.output().splitlines() if ln.startswith("convert_out: failed:")]
        assert len(said) == 1, run.output()[-3000:]
        assert "ran out of disk space after" in said[0], said  # (the file it names, when its error has one)
        assert "The export needs ~0.2" in said[0] and "beside models/sft-hf" in said[0], said  # where, how much
        assert "`dvc repro` converts again" in said[0], said
        assert not (models / "sft-hf").exists() and not list(models.glob(".sft-hf.tmp-*"))
        assert yaml.safe_load((root / "dvc.lock").read_text()) == lock_before

        filler.unlink()
        sh(["dvc", "repro", "convert_out"], root)
        assert json.loads(sh(["dvc", "status", "--json", "convert_out"], root).stdout) == {}
        lock_after = yaml.safe_load((root / "dvc.lock").read_text())
        assert lock_after["stages"]["convert_out"]["outs"] == lock_before["stages"]["convert_out"]["outs"]


@pytest.mark.skipif(bool(machine_faults.unavailable()), reason=str(machine_faults.unavailable()))
def test_a_full_disk_under_a_pull_is_one_line_and_the_pull_after_it_is_whole(tiny_run, tmp_path):
    """A new machine whose DVC cache is on a disk too small for what it pulls (a local-directory
    remote holding tiny_run's outputs): tools.remote says so in one line naming the cache, and
    nothing half-fetched is checked out as an output; with the space freed, the same command
    pulls everything, byte for byte."""
    store = tmp_path / "remote"
    producer = clone_workspace(tiny_run, tmp_path)  # (sharing its cache: what it pushes is there)
    sh(["dvc", "remote", "add", "--local", "-f", "-d", "store", str(store)], producer)
    sh(["dvc", "push", "-q"], producer)
    root = tmp_path / "new-machine"
    sh(["git", "clone", "-q", str(tiny_run.path), str(root)], tmp_path)
    sh(["dvc", "remote", "add", "--local", "-f", "-d", "store", str(store)], root)
    cache = tmp_path / "cache-disk"
    with machine_faults.small_disk(cache, 1024):
        sh(["dvc", "cache", "dir", "--local", str(cache)], root)
        filler = cache / "filler"
        filler.write_bytes(b"\0" * (900 << 20))  # a neighbour's files: ~120 MB left, the outputs need ~500
        proc = sh(["python", "-m", "tools.remote", "pull"], root, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and lines[-1].startswith(
            f"remote: failed: pull ran out of disk space in the DVC cache {cache}"
        ), proc.stderr[-3000:]
        assert "python -m tools.remote pull" in lines[-1]
        missing = json.loads(sh(["dvc", "status", "--json"], root).stdout)
        assert missing, "dvc status must name what the pull did not finish"

        filler.unlink()
        sh(["python", "-m", "tools.remote", "pull"], root)
        from test_remote import file_hashes

        for output in ("models/base-hf", "models/sft-maxtext", "models/sft-hf"):
            assert file_hashes(root, output) == file_hashes(tiny_run.path, output), output
        status = json.loads(sh(["dvc", "status", "--json"], root).stdout)
        assert not [c for changes in status.values() for c in changes if "changed outs" in c], status


def second_repro_is_refused(root: Path) -> None:
    """A second `dvc repro` in a workspace where one runs stops at once, in words, and
    leaves the first alone (the caller's run goes on and finishes)."""
    second = sh(["dvc", "repro"], root, check=False, timeout=120)
    assert second.returncode != 0
    said = second.stdout + second.stderr
    # DVC's workspace lock, or (while a stage runs and DVC has let that go) its per-output
    # read/write lock: "ERROR: failed to reproduce 'base_model': '.../models/base-hf' is busy,
    # it is being blocked by: (PID ...): dvc repro ..."
    assert "Unable to acquire lock" in said or "is busy, it is being blocked by" in said, said
    assert "Traceback" not in said


@pytest.mark.skipif(bool(machine_faults.unavailable()), reason=str(machine_faults.unavailable()))
@pytest.mark.parametrize("done", [False, True])
def test_a_kill_for_memory_that_reads_as_a_clean_exit_is_said_when_the_work_is_unfinished(tmp_path, monkeypatch, done):
    """A worker whose process the kernel's out-of-memory killer ended, yet which exits 0 (here a
    shell whose child was killed: in one suite run MaxText itself read so), is a kill for memory
    while the work is unfinished (training: no final checkpoint), and a success when it is done."""
    from stages.lib import maxtext_process

    monkeypatch.setattr(maxtext_process, "LOG_DIR", str(tmp_path))
    with machine_faults.memory_group() as group:
        group.limit(64 << 20)
        grow = 'x = [bytearray(b"\\x01") * (16 << 20) for _ in range(64)]'
        script = f"echo $$ > {group.path / 'cgroup.procs'}; sleep 2; {sys.executable} -c '{grow}'; exit 0"
        worker = maxtext_process.Worker("MaxText", ["sh", "-c", script], dict(os.environ), str(tmp_path / "w.log"))
        job = ("train", "maxtext.trainers.post_train.sft.train_sft", [worker], None, 0.5, "lower the batch")
        if done:
            maxtext_process.run_workers(*job, finished=lambda: True)
        else:
            with pytest.raises(maxtext_process.MaxTextFailed, match="was killed by the kernel for lack of memory"):
                maxtext_process.run_workers(*job, finished=lambda: False)
        assert group.oom_kills() == 1
