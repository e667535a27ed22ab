"""One worker of a grid run past one machine: takes variants from the grid's board on the git
remote, runs each with `dvc exp run`, pushes it with `dvc exp push`, until none is left.

    python -m tools.grid_worker --grid ID --worker NAME --dir CLONE [--remote GIT_URL]

`python -m tools.grid KEY=V1,V2 ... --on ...` starts the workers (local processes, over
gcloud ssh on TPU VMs, as XPK workloads: tools/grid_engines.py); run by hand it is one more
worker. CLONE is this worker's own clone of the project (made from GIT_URL if missing),
checked out at the grid's base commit. Per variant, in order:

  1. the stages no variant changes (the spec's shared_stages), once for the whole grid: the
     first worker runs them (`dvc repro --pull`), pushes their outputs (`dvc push
     --run-cache`) and what they wrote to git (dvc.lock, their metrics files) as the commit
     refs/grid/<id>/shared; the others wait for it and lay that commit's files over the base,
     so that their `dvc exp run --pull` finds those stages unchanged and pulls their outputs
     instead of running them (the run-cache alone would not do: `dvc push --run-cache` leaves
     out the objects of uncached outputs, the metrics files, and DVC then runs the stage);
  2. `dvc exp run --pull -n NAME -S KEY=VALUE ...` from a clean checkout of the base;
  3. `dvc exp push origin NAME`: the experiment's git ref and its outputs;
  4. done (or failed, with the last line of its log) on the board.

While a variant runs its claim is moved forward every `heartbeat` seconds. A worker killed
outright leaves a claim that another worker takes over once it is `stale_after` seconds old
(or this one, restarted under the same name, at once); the train stage then resumes from the
checkpoints on runtime.scratch_dir (gs://: any machine finds them). SIGTERM (a spot VM's
preemption notice, Ctrl-C) stops the variant's run and gives its claim back. A claim taken
over while this worker was silent stops its run: one variant never trains twice at once.
Each variant's output: <CLONE>/.dvc/tmp/grid-logs/<variant>.log (and this worker's stdout);
its stages' own logs (MaxText's, logs/*.log) of its last attempt here: <variant>/ beside it.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from stages.shared.errors import UserError
from tools.grid_board import SHARED, Board, Mark, RemoteUnreachable

LOGS = Path(".dvc") / "tmp" / "grid-logs"  # git- and DVC-ignored: kept across variants


def tool(name: str) -> str:
    """`dvc`, `python` of this worker's environment, whatever PATH says."""
    return str(Path(sys.executable).parent / name)


def last_line(path: Path) -> str:
    """What a failed run's log says last: the stage's own one line (`train: error: ...`), which
    names the field or the failure, rather than DVC's "failed to reproduce" after it."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    own = [line for line in lines if re.match(r"^[a-z_]+: (error|failed|interrupted)\b", line)]
    return (own or lines or ["(no output)"])[-1][:300]


class Worker:
    def __init__(self, board: Board, spec: dict, name: str, clone: Path):
        self.board, self.spec, self.name, self.clone = board, spec, name, clone
        self.stopping = threading.Event()  # SIGTERM: stop, give the claim back, exit
        self.child: subprocess.Popen | None = None
        self.held: Mark | None = None  # the claim of the variant running, as last moved

    # -- choosing ------------------------------------------------------------------------------
    def pick(self) -> tuple[str, Mark | None] | str | None:
        """(variant, claim to take over or None) to claim next; "wait" while only other workers'
        live claims stand between this worker and the end; None when the grid is over."""
        state, now, stale_after = self.board.refresh(), time.time(), self.spec["stale_after"]
        order = [SHARED] if self.spec["shared_stages"] else []
        shared = order and state.of(SHARED, now, stale_after)
        if shared == "failed":
            return None  # nothing can run without them; the board says why
        candidates = order if shared and shared != "done" else self.spec["order"]
        states = {v: state.of(v, now, stale_after) for v in candidates}
        mine = [v for v in candidates if states[v] in ("running", "stale") and state.claims[v].worker == self.name]
        if mine:  # restarted: this worker's own claim first, at once
            return mine[0], state.claims[mine[0]]
        for v in candidates:
            if states[v] == "queued":
                return v, None
        for v in candidates:
            if states[v] == "stale":
                return v, state.claims[v]
        return "wait" if "running" in states.values() else None

    def loop(self) -> None:
        while not self.stopping.is_set():
            try:
                picked = self.pick()
                if picked not in (None, "wait"):
                    variant, stale = picked
                    held = self.board.claim(variant, self.name, taking_over=stale)
            except RemoteUnreachable as e:  # a blip: ask again
                print(f"grid worker {self.name}: {e}; trying again in {self.spec['poll']} s", flush=True)
                picked = "wait"
            if picked is None:
                break
            if picked == "wait":
                self.stopping.wait(self.spec["poll"])
                continue
            if held is None:
                continue  # another worker was first
            how = ""
            if stale:
                whose = "its own claim from before a restart" if stale.worker == self.name else f"from {stale.worker}"
                how = f" (taken over: {whose}, silent {stale.age(time.time()):.0f} s)"
            print(f"grid worker {self.name}: {variant}: started{how}", flush=True)
            self.run_variant(variant, held)
        print(f"grid worker {self.name}: {'stopped' if self.stopping.is_set() else 'nothing left to run'}", flush=True)

    # -- running one ---------------------------------------------------------------------------
    def commands(self, variant: str) -> list[list[str]]:
        dvc = tool("dvc")
        if variant == SHARED:
            stages = self.spec["shared_stages"]
            return [[dvc, "repro", "--pull", *stages], [dvc, "push", "--run-cache", *stages]]
        sets = [a for s in self.spec["variants"][variant] for a in ("-S", s)]
        exists = self.board.git("for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
        push = [dvc, "exp", "push", self.board.remote, variant]
        if any(r.endswith("/" + variant) for r in exists):  # run before a kill that came before its push
            return [push]
        return [[dvc, "exp", "run", "--pull", "-n", variant, *sets], push]

    def clean_checkout(self) -> None:
        """The base commit as committed: the previous variant's params and lock undone (its
        outputs stay in the workspace and cache: DVC finds what it can reuse)."""
        self.board.git("reset", "-q", "--hard", self.spec["base"])
        self.board.git("clean", "-fdq")
        if shared := self.board.shared():
            # What the shared stages wrote to git (dvc.lock, their metrics files), over the
            # base: DVC then finds them unchanged and pulls their outputs instead of running them.
            self.board.git("checkout", shared, "--", ".")
        # A killed run's leftovers. Its entry in DVC's lock file names a pid that, reparented to
        # an init that does not reap (a container's), stays a zombie which DVC takes for a live
        # holder; no other DVC uses this clone.
        shutil.rmtree(self.clone / ".dvc" / "tmp" / "exps", ignore_errors=True)
        (self.clone / ".dvc" / "tmp" / "rwlock").unlink(missing_ok=True)
        # The last variant's stage logs are kept (keep_stage_logs); none of them may pass for this one's.
        shutil.rmtree(self.clone / "logs", ignore_errors=True)

    def run_variant(self, variant: str, held: Mark) -> None:
        self.held, lost = held, threading.Event()
        beat = threading.Thread(target=self.heartbeat, args=(variant, lost), daemon=True)
        beat.start()
        log = self.clone / LOGS / f"{variant}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        try:
            self.clean_checkout()
            for cmd in self.commands(variant):
                code = self.stream(cmd, log)
                if lost.is_set() or self.stopping.is_set():
                    return
                if code != 0:
                    line = last_line(log)
                    self.record(variant, "failed", {"worker": self.name, "line": line})
                    print(f"grid worker {self.name}: {variant}: failed: {line}", flush=True)
                    return
            if variant == SHARED:
                self.board.publish_shared(self.spec["base"])
            self.record(variant, "done", {"worker": self.name, "seconds": round(time.time() - started)})
            print(f"grid worker {self.name}: {variant}: done in {time.time() - started:.0f} s", flush=True)
        finally:
            lost.set()  # (ends the heartbeat)
            beat.join()
            if self.held:
                try:
                    self.board.release(variant, self.held)
                except RemoteUnreachable:
                    pass  # it goes stale instead
            self.held = None
            self.keep_stage_logs(variant)

    def keep_stage_logs(self, variant: str) -> None:
        """The stages' own logs of this attempt (logs/*.log: MaxText's output, where a failure's
        cause is) kept beside the variant's output: the next variant's run writes over them."""
        kept = self.clone / LOGS / variant
        for path in (self.clone / "logs").glob("*.log"):
            kept.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, kept / path.name)

    def record(self, variant: str, outcome: str, info: dict) -> None:
        """The outcome on the board, through a blip of the remote; past that the claim goes
        stale and another worker runs the variant again."""
        for attempt in range(5):
            try:
                self.board.finish(variant, outcome, info)
                return
            except RemoteUnreachable as e:
                print(f"grid worker {self.name}: recording {variant} {outcome}: {e}", flush=True)
                time.sleep(self.spec["poll"] * (attempt + 1))

    def heartbeat(self, variant: str, lost: threading.Event) -> None:
        """Moves the claim forward until the run ends; stops the run if the claim is lost (taken
        over, or the remote unreachable for longer than a claim stays live)."""
        last_ok = time.time()
        while not lost.wait(self.spec["heartbeat"]):
            try:
                moved = self.board.heartbeat(variant, self.held)
            except RemoteUnreachable as e:
                if time.time() - last_ok < self.spec["stale_after"]:
                    continue
                moved, why = None, f"the git remote unreachable for {self.spec['stale_after']} s ({e})"
            else:
                why = "taken over by another worker"
            if moved is None:
                print(f"grid worker {self.name}: {variant}: claim lost ({why}); stopping its run", flush=True)
                self.held = None
                lost.set()
                self.stop_child()
                return
            self.held, last_ok = moved, time.time()

    def stream(self, cmd: list[str], log: Path) -> int:
        """Runs one command in the clone, its output to the variant's log and to stdout."""
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        with open(log, "a") as f:
            f.write(f"$ {' '.join(Path(cmd[0]).name if i == 0 else a for i, a in enumerate(cmd))}\n")
            f.flush()
            # Its own process group: SIGTERM reaches DVC, the stage and MaxText, not this worker.
            out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
            self.child = subprocess.Popen(cmd, cwd=self.clone, env=env, process_group=0, **out)
            if self.stopping.is_set():
                self.stop_child()
            for line in self.child.stdout:
                f.write(line)
                f.flush()
                sys.stdout.write(line)
            code = self.child.wait()
            sys.stdout.flush()
        self.child = None
        return code

    def stop_child(self) -> None:
        child = self.child
        if child and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def prepare(clone: Path, grid: str, remote_url: str | None, config_local: str | None) -> tuple[Board, dict]:
    """This worker's clone at the grid's base, its DVC remote set: cloned if missing."""
    if not (clone / ".git").exists():
        if not remote_url:
            raise UserError(f"--dir {clone}: not a git clone; give --remote GIT_URL to clone it")
        clone.parent.mkdir(parents=True, exist_ok=True)
        clone_it = ["git", "clone", "-q", "--no-checkout", remote_url, str(clone)]
        proc = subprocess.run(clone_it, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"git clone {remote_url}: {proc.stderr.strip()[-300:]}")
    board = Board(str(clone), grid)
    board.fetch()
    spec = board.spec()
    board.git("checkout", "-q", "--force", "--detach", spec["base"])
    if config_local:  # a local worker: the user's own remote settings, copied (never on a command line)
        shutil.copy(config_local, clone / ".dvc" / "config.local")
    elif spec.get("dvc_remote_url"):
        subprocess.run(
            [tool("dvc"), "remote", "modify", "--local", spec["dvc_remote"], "url", spec["dvc_remote_url"]],
            cwd=clone,
            check=True,
        )
    return board, spec


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", required=True, help="the grid's id (python -m tools.grid prints it)")
    parser.add_argument("--worker", required=True, help="this worker's name, the same when it is restarted")
    parser.add_argument("--dir", required=True, type=Path, help="this worker's clone (made if missing)")
    parser.add_argument("--remote", help="the project's git remote, to clone from")
    parser.add_argument("--dvc-config-local", help=argparse.SUPPRESS)  # the local engine's copy of the user's
    return parser


def main() -> None:
    args = parser().parse_args()
    board, spec = prepare(args.dir.resolve(), args.grid, args.remote, args.dvc_config_local)
    worker = Worker(board, spec, args.worker, args.dir.resolve())

    def on_term(signum, frame):
        worker.stopping.set()
        worker.stop_child()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    worker.loop()
    if worker.stopping.is_set():
        sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    # Not stages.lib.cli.run: that ties a process to its parent's life, and a worker on a VM
    # outlives the ssh session that started it.
    try:
        main()
    except UserError as e:
        print(f"grid_worker: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
