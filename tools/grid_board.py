"""A grid's state, kept as git refs on the project's git remote: the one place every worker
of a grid, wherever it runs, reads and writes (tools/grid_worker.py; docs/sweeps.md).

    refs/grid/<id>/base               the commit every variant starts from (the user's HEAD)
    refs/grid/<id>/spec               a commit holding grid.json: the variants and their -S values
    refs/grid/<id>/shared             the base plus what the shared stages wrote to git (dvc.lock)
    refs/grid/<id>/claim/<variant>    held by the worker running it; moved forward as its heartbeat
    refs/grid/<id>/done/<variant>     its experiment is pushed (`dvc exp push`)
    refs/grid/<id>/failed/<variant>   it failed; the commit's subject holds the last log line

A claim is taken with a compare-and-swap push (`git push --force-with-lease=REF:` creates REF
only where it does not exist; `--force-with-lease=REF:SHA` moves it only from SHA), which the
git server does atomically: two workers never both hold a variant. A worker that stops
heartbeating (killed, preempted, its VM gone) leaves a claim that goes stale after
`stale_after` seconds; another worker then takes it over, or the same worker restarted takes
its own claim back at once. Each ref's commit subject is one line of JSON (who, when, what).
No server or scheduler of our own: git is the lock and the record.
"""

import dataclasses
import json
import os
import subprocess
import time

from stages.shared.errors import UserError

# The pseudo-variant whose holder runs the stages no variant changes, once, for every worker.
SHARED = "_shared"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
# Who writes the grid's commits (workers on fresh VMs have no git identity of their own).
IDENTITY = {
    "GIT_AUTHOR_NAME": "tools.grid",
    "GIT_AUTHOR_EMAIL": "grid@localhost",
    "GIT_COMMITTER_NAME": "tools.grid",
    "GIT_COMMITTER_EMAIL": "grid@localhost",
}


class RemoteUnreachable(Exception):
    """The git remote did not answer: nothing about the grid can be known or changed."""


@dataclasses.dataclass(frozen=True)
class Mark:
    """One ref of the grid: its commit and the JSON of the commit's subject."""

    sha: str
    info: dict

    @property
    def worker(self) -> str:
        return self.info.get("worker", "?")

    def age(self, now: float) -> float:
        return now - float(self.info.get("at", 0))


@dataclasses.dataclass
class State:
    """What the remote said at one fetch."""

    claims: dict[str, Mark]
    done: dict[str, Mark]
    failed: dict[str, Mark]

    def of(self, variant: str, now: float, stale_after: float) -> str:
        """queued | running | stale | done | failed."""
        if variant in self.done:
            return "done"
        if variant in self.failed:
            return "failed"
        claim = self.claims.get(variant)
        if claim is None:
            return "queued"
        return "stale" if claim.age(now) > stale_after else "running"

    def describe(self, variant: str, now: float, stale_after: float) -> str:
        """The state in words: where it runs, how long it took, why it failed."""
        what = self.of(variant, now, stale_after)
        if what == "done":
            return f"done on {self.done[variant].worker} in {self.done[variant].info.get('seconds', '?')} s"
        if what == "failed":
            return f"failed on {self.failed[variant].worker}: {self.failed[variant].info.get('line', '')}"
        claim = self.claims.get(variant)
        if what == "running":
            return f"running on {claim.worker} (heartbeat {claim.age(now):.0f} s ago)"
        if what == "stale":
            return f"stale: {claim.worker} silent {claim.age(now):.0f} s; the next free worker takes it over"
        return what


class Board:
    """The grid `grid_id` on the git remote `remote` of the clone at `repo`."""

    def __init__(self, repo: str, grid_id: str, remote: str = "origin"):
        self.repo, self.grid_id, self.remote = repo, grid_id, remote
        self.prefix = f"refs/grid/{grid_id}"

    # -- git, in this clone ------------------------------------------------------------------
    def git(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["git", "-C", self.repo, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, **IDENTITY, "GIT_TERMINAL_PROMPT": "0"},
        )
        if check and proc.returncode != 0:
            raise RemoteUnreachable(f"git {' '.join(args[:2])}: {(proc.stderr or proc.stdout).strip()[-500:]}")
        return proc

    def _commit(self, info: dict, parent: str | None = None, tree: str = EMPTY_TREE) -> str:
        if tree == EMPTY_TREE:
            self.git("hash-object", "-t", "tree", "-w", "--stdin", stdin="")
        return self.git(
            "commit-tree", tree, *(["-p", parent] if parent else []), "-m", json.dumps(info, sort_keys=True)
        ).stdout.strip()

    def _swap(self, ref: str, new: str | None, expect: str | None) -> bool:
        """Moves the remote's `ref` from `expect` (None: it must not exist) to `new` (None:
        deletes it), atomically; False if the remote's ref was not `expect`."""
        full = f"{self.prefix}/{ref}"
        proc = self.git(
            "push", "--porcelain", f"--force-with-lease={full}:{expect or ''}", self.remote, f"{new or ''}:{full}",
            check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            return True
        # Refused (the lease failed here, or the server found the ref moved: a race lost), or
        # not delivered: what the remote holds now tells which.
        now = self.git("ls-remote", self.remote, full).stdout.split("\t")[0].strip() or None
        return now == new

    # -- the grid -----------------------------------------------------------------------------
    def publish(self, spec: dict, base: str) -> bool:
        """Writes the grid's base and spec to the remote; False if a grid of this id is already
        there (the same command run again: it continues that grid)."""
        blob = self.git("hash-object", "-w", "--stdin", stdin=json.dumps(spec, indent=1, sort_keys=True)).stdout
        tree = self.git("mktree", stdin=f"100644 blob {blob.strip()}\tgrid.json\n").stdout.strip()
        commit = self._commit({"grid": self.grid_id, "at": time.time()}, tree=tree)
        self._swap("base", base, None)  # (already there: this grid's, whose id names its base)
        return self._swap("spec", commit, None)

    def fetch(self) -> None:
        """This clone's refs/grid/<id>/* made the remote's (deleted claims included)."""
        self.git("fetch", "-q", "--prune", self.remote, f"+{self.prefix}/*:{self.prefix}/*")

    def shared(self) -> str | None:
        """The commit holding what the shared stages wrote to git, once they have run."""
        proc = self.git("rev-parse", "--verify", "-q", f"{self.prefix}/shared", check=False)
        return proc.stdout.strip() or None

    def publish_shared(self, base: str) -> None:
        """Commits what the shared stages changed in this clone (on top of `base`) as the grid's
        shared commit (kept if a worker before this one published it)."""
        self.git("add", "-A")
        tree = self.git("write-tree").stdout.strip()
        message = f"the shared stages of grid {self.grid_id}"
        sha = self.git("commit-tree", tree, "-p", base, "-m", message).stdout.strip()
        self._swap("shared", sha, None)
        self.fetch()

    def spec(self) -> dict:
        proc = self.git("show", f"{self.prefix}/spec:grid.json", check=False)
        if proc.returncode != 0:
            raise UserError(f"grid {self.grid_id}: not on the git remote '{self.remote}'; its grids: {self.grids()}")
        return json.loads(proc.stdout)

    def state(self) -> State:
        """The grid's claims and outcomes as last fetched."""
        out = self.git("for-each-ref", "--format=%(refname)%09%(objectname)%09%(contents:subject)", self.prefix).stdout
        state = State({}, {}, {})
        for line in out.splitlines():
            ref, sha, subject = line.split("\t", 2)
            kind, _, variant = ref.removeprefix(self.prefix + "/").partition("/")
            if kind in ("claim", "done", "failed"):
                getattr(state, kind + "s" if kind == "claim" else kind)[variant] = Mark(sha, _info(subject))
        return state

    def refresh(self) -> State:
        self.fetch()
        return self.state()

    def claim(self, variant: str, worker: str, taking_over: Mark | None = None) -> Mark | None:
        """Takes `variant` for `worker` (from a stale or its own earlier claim, if given); None
        if another worker was first."""
        info = {"worker": worker, "at": time.time(), "variant": variant}
        previous = taking_over.sha if taking_over else None
        sha = self._commit(info, parent=previous)
        return Mark(sha, info) if self._swap(f"claim/{variant}", sha, previous) else None

    def heartbeat(self, variant: str, held: Mark) -> Mark | None:
        """The claim moved forward (a fast-forward of the one held); None if it is no longer
        this worker's (taken over while this one was silent)."""
        info = {**held.info, "at": time.time()}
        sha = self._commit(info, parent=held.sha)
        return Mark(sha, info) if self._swap(f"claim/{variant}", sha, held.sha) else None

    def release(self, variant: str, held: Mark) -> None:
        """Gives the claim up (already gone or taken over: nothing to do)."""
        self._swap(f"claim/{variant}", None, held.sha)

    def finish(self, variant: str, outcome: str, info: dict) -> None:
        """Records `done` or `failed` for a variant (kept if one is already there)."""
        assert outcome in ("done", "failed")
        self._swap(f"{outcome}/{variant}", self._commit({**info, "at": time.time()}), None)

    def forget_failure(self, variant: str) -> None:
        """Removes a variant's failure, so that workers run it again (--retry-failed)."""
        if mark := self.state().failed.get(variant):
            self._swap(f"failed/{variant}", None, mark.sha)

    def grids(self) -> list[str]:
        """The ids of every grid on the remote."""
        out = self.git("ls-remote", self.remote, "refs/grid/*/spec").stdout
        return [line.split("\t")[1].split("/")[2] for line in out.splitlines() if "\t" in line]


def _info(subject: str) -> dict:
    try:
        info = json.loads(subject)
    except json.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) else {}
