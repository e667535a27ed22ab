"""MaxText's working directory for one training run: named by what it trains, resumable.

The directory is `<runtime.scratch_dir>/train-<digest>` (the preference stage's:
`preference-<digest>`), local or on gs://, and is not a DVC
output: it holds the intermediate checkpoints a killed run resumes from. The digest covers
exactly what determines the training:
  - the params the train stage declares in dvc.yaml (runtime.* is not among them),
  - the content hashes of its data dependencies, as DVC records them (code is not hashed:
    a fix to the pipeline's own code resumes a run instead of discarding hours of it); a
    dependency whose bytes are not reproducible (an Orbax checkpoint has random file names
    and timestamps) by the inputs and params of the stage that made it, so converting the
    base again on a new VM still finds the run,
  - the MaxText and Tunix versions (another trainer must not resume this one's checkpoints).
No path, mtime or machine enters it, so the same inputs pulled on a new VM find the same
directory on gs://.

This module owns the scratch layout; nothing else builds a path under runtime.scratch_dir:
  <scratch>/train-<digest>/sft/checkpoints/   MaxText's checkpoints (Workdir.checkpoints)
  <scratch>/train-<digest>/inputs/<name>/     what a multi-host job's hosts read of this run
                                              (Workdir.staged: each host's stream)
  <scratch>/inputs/<name>/                    inputs every run on the same base and data shares
                                              (shared_input: the base checkpoint, tokenizer files)
  <local>/                                    this machine's files of the run: MaxText's metrics
                                              file, the stream, worker-inputs/ (the hosts' copies);
                                              the run's directory itself, or .scratch/train-<digest>
                                              when the scratch is on gs://
"""

import fcntl
import hashlib
import importlib.metadata
import json
import os

import fsspec

from stages.lib.dvc_yaml import declared
from stages.lib.params import plain
from stages.shared.errors import StageFailed

TRAINER_PACKAGES = ("maxtext", "google-tunix")
# Outputs identified by what they were made from, not by their bytes (see above).
IDENTIFIED_BY_INPUTS = {"models/base-maxtext": "convert_in"}
PREFIX = "train-"
LOCAL_SCRATCH = ".scratch"  # this machine's side of a gs:// scratch (relative to the project)
INPUTS = "inputs"
METRICS_FILE = "metrics.jsonl"  # MaxText's per-step metrics lines (its metrics_file)


def data_dependencies(deps: list[str]) -> list[str]:
    """The deps that are data (what is trained), not the pipeline's code or a metrics file."""
    return [d for d in deps if not d.startswith(("stages/", "metrics/"))]


# Declared params that decide how much memory training takes, or which kernel computes the
# same sums, not what it computes: a run resumes across a change of them. Setting remat_policy
# to full is what an out-of-memory kill asks for (stages/lib/maxtext_process.py), and must not
# throw away the checkpoints so far.
MEMORY_ONLY = ("train.remat_policy", "train.attention")


def tracked_values(params: dict, keys: list[str]) -> dict:
    """{dotted key: value} for the declared keys (a key may name a whole section), less MEMORY_ONLY."""
    out = {}
    for key in keys:
        node = params
        for part in key.split("."):
            node = node[part]
        out[key] = plain(node)
    for dotted in MEMORY_ONLY:
        section, _, name = dotted.rpartition(".")
        out.pop(dotted, None)
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k != name}
    return out


def digest(tracked: dict, inputs: dict, trainer: dict[str, str]) -> str:
    """The working directory's name for these inputs (16 hex digits)."""
    blob = json.dumps({"params": tracked, "inputs": inputs, "trainer": trainer}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trainer_versions() -> dict[str, str]:
    return {pkg: importlib.metadata.version(pkg) for pkg in TRAINER_PACKAGES}


def _dvc_hashes(repo, stage: str, paths: list[str]) -> dict[str, str]:
    out = {}
    (target,) = repo.stage.collect(stage)
    for dep in target.deps:
        if dep.def_path in paths:
            out[dep.def_path] = dep.get_hash().value if dep.exists else "missing"
    return out


def input_hashes(params: dict, stage: str = "train") -> dict:
    """What identifies each of a stage's data dependencies: DVC's content hash, from its state
    database (DVC hashed them just before running the stage, so nothing is read again), or,
    for IDENTIFIED_BY_INPUTS, the producing stage's own inputs and params; "missing" for a
    dependency not computed yet (a --dry-run before the inputs exist)."""
    from dvc.repo import Repo

    _, deps = declared(stage)
    out = {}
    with Repo() as repo:
        out.update(_dvc_hashes(repo, stage, [d for d in data_dependencies(deps) if d not in IDENTIFIED_BY_INPUTS]))
        for path in data_dependencies(deps):
            if path in IDENTIFIED_BY_INPUTS:
                producer = IDENTIFIED_BY_INPUTS[path]
                keys, producer_deps = declared(producer)
                out[path] = {
                    "made_by": producer,
                    "params": tracked_values(params, keys),
                    "from": _dvc_hashes(repo, producer, data_dependencies(producer_deps)),
                }
    return out


def shared_input(params: dict, name: str) -> str:
    """Where an input shared by every run on the same base and data is staged for a multi-host
    job (<scratch>/inputs/<name>)."""
    return f"{params['runtime']['scratch_dir'].rstrip('/')}/{INPUTS}/{name}"


def for_params(params: dict, stage: str = "train", run_name: str = "sft") -> "Workdir":
    """The working directory of `stage`'s training (train, or preference: `<stage>-<digest>`)."""
    keys, _ = declared(stage)
    inputs = input_hashes(params, stage)
    prefix = PREFIX if stage == "train" else f"{stage}-"
    name = prefix + digest(tracked_values(params, keys), inputs, trainer_versions())
    return Workdir(params["runtime"]["scratch_dir"], name, run_name, inputs=inputs, prefix=prefix)


class Workdir:
    """A run's working directory, `url`, on the local disk or on gs://.

    MaxText writes its checkpoints under `url`; files that must be local (MaxText's per-step
    metrics file, the data stream it reads) live in `local`, the same directory unless the
    scratch is on gs://. There, what a resume needs beyond the checkpoints (the metrics lines
    so far, the data position) is copied beside them (`save`), so that a new VM with an empty
    disk continues the same curve (`restore`); the stream itself is rewritten from the data.
    """

    def __init__(
        self, scratch_dir: str, name: str, run_name: str = "sft", inputs: dict | None = None, prefix: str = PREFIX
    ):
        self.name = name
        self.prefix = prefix  # what the names of this stage's working directories begin with (others)
        self.inputs = inputs or {}  # what identified it (input_hashes): also keys the inputs staged for many hosts
        remote = "://" in scratch_dir
        local_scratch = LOCAL_SCRATCH if remote else scratch_dir
        self.url = f"{scratch_dir.rstrip('/')}/{name}" if remote else os.path.abspath(os.path.join(scratch_dir, name))
        self.local = os.path.abspath(os.path.join(local_scratch, name))
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.checkpoints = f"{self.root}/{run_name}/checkpoints"
        self.profile = f"{self.root}/{run_name}/tensorboard/plugins/profile"  # MaxText's traces (profiler=xplane)
        self.metrics_file = os.path.join(self.local, METRICS_FILE)

    def staged(self, name: str) -> str:
        """Where an input of this run alone is staged for a multi-host job (its streams)."""
        return f"{self.url}/{INPUTS}/{name}"

    @property
    def worker_copies(self) -> str:
        """Where each worker of a multi-host job copies its inputs, relative to the project
        directory it runs in (the same on every machine)."""
        return os.path.join(os.path.relpath(self.local), "worker-inputs")

    @property
    def on_gcs(self) -> bool:
        return self.url.startswith("gs://")

    def complete_steps(self) -> list[int]:
        """Steps with a finished checkpoint. Locally Orbax renames a step's directory into place
        when it is done; on GCS, which cannot rename atomically, the directory has its final
        name from the start and a commit_success.txt in it says it is done."""
        self.fs.invalidate_cache()  # MaxText's processes write there: gcsfs's listing cache is stale
        if not self.fs.exists(self.checkpoints):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.checkpoints, detail=False))
        steps = sorted(int(n) for n in names if n.isdigit())
        if self.on_gcs:
            steps = [s for s in steps if self.fs.exists(f"{self.checkpoints}/{s}/commit_success.txt")]
        return steps

    def tidy(self, keep: int) -> list[str]:
        """Before a run resumes here: deletes the checkpoints a killed or failed save left
        half-written (Orbax's `<step>.orbax-checkpoint-tmp*`, never a resume point) and all but
        the newest `keep` whole ones: on a full disk, that is the room the next save needs.
        Under the directory's lock (a running trainer's save is not half-written). Returns
        the half-written ones it deleted. Local only: on GCS a step is done by its marker, not its name, and
        Orbax's own clean-up handles the rest."""
        if self.on_gcs or not os.path.isdir(self.checkpoints):
            return []
        with self.lock():
            left = [n for n in os.listdir(self.checkpoints) if not n.isdigit() and ".orbax-checkpoint-tmp" in n]
            for name in left:
                self.fs.rm(f"{self.checkpoints}/{name}", recursive=True)
            self.prune(keep)
        return left

    def prune(self, keep: int) -> None:
        """Deletes all but the newest `keep` complete checkpoints."""
        for step in self.complete_steps()[:-keep]:
            self.fs.rm(f"{self.checkpoints}/{step}", recursive=True)

    def lock(self):
        """Holds the directory for this process; a second training on the same inputs (say, an
        orphan of a killed `dvc repro`) is refused instead of corrupting the checkpoints."""
        os.makedirs(self.local, exist_ok=True)
        handle = open(os.path.join(self.local, ".lock"), "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StageFailed(f"another training run is using {self.url}; wait for it to end, or stop it") from None
        return handle

    def others(self) -> list[str]:
        """Working directories of runs with other inputs (killed, then params changed)."""
        parent = self.url.rsplit("/", 1)[0]
        fs, root = fsspec.core.url_to_fs(parent)
        found = fs.glob(f"{root}/{self.prefix}*") if fs.exists(root) else []
        return [p for p in found if not p.rstrip("/").endswith(self.name)]

    def save(self, name: str) -> None:
        """Copies local/<name> beside the checkpoints (gs:// only; locally they are one place)."""
        path = os.path.join(self.local, name)
        if self.on_gcs and os.path.exists(path):
            self.fs.put_file(path, f"{self.root}/{name}")

    def restore(self, name: str) -> None:
        """Brings <name> back from beside the checkpoints when this machine's copy is missing
        or shorter (both are append-only records of the same run: the longer one is newer)."""
        remote, path = f"{self.root}/{name}", os.path.join(self.local, name)
        if not self.on_gcs or not self.fs.exists(remote):
            return
        if os.path.exists(path) and os.path.getsize(path) >= self.fs.size(remote):
            return
        os.makedirs(self.local, exist_ok=True)
        self.fs.get_file(remote, path)

    def fetch(self, path: str, dest: str) -> None:
        """Copies a directory of the run (a checkpoint's params, the traces) to `dest` on this
        machine: hard links when both are local (no data copied), a download from gs://."""
        from stages.lib import outputs

        if self.on_gcs:
            self.fs.get(path.rstrip("/") + "/", dest, recursive=True)
        else:
            outputs.link_or_copy_tree(path, dest)

    def keeper(self, keep: int):
        """Run at every progress poll: prunes old checkpoints, and saves the metrics lines beside
        the newest checkpoint once they reach its step (what a resume on another VM continues)."""
        from stages.lib import train_metrics

        saved_through = [0]

        def poll() -> None:
            self.prune(keep)
            newest = max(self.complete_steps(), default=0)
            if newest > saved_through[0]:
                logged = train_metrics.steps(self.metrics_file)
                if logged and int(logged[-1]["step"]) >= newest:
                    self.save(METRICS_FILE)
                    saved_through[0] = newest

        return poll

    def remove(self) -> None:
        for fs, path in ((self.fs, self.root), (fsspec.filesystem("file"), self.local)):
            if fs.exists(path):
                fs.rm(path, recursive=True)
