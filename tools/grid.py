"""A grid of experiments, each named after what it changes: queued on this machine, or run by
workers on other machines (docs/sweeps.md).

    python -m tools.grid train.learning_rate=1e-3,3e-4 train.steps=40,80   # 4 experiments, queued
    dvc queue start                  # one worker: one accelerator
    dvc exp show --only-changed      # compare; then: dvc exp apply NAME

    python -m tools.grid train.learning_rate=1e-4,3e-4 --on vm:tpu-a,tpu-b   # a worker per TPU VM
    python -m tools.grid train.learning_rate=1e-4,3e-4 --on xpk:4            # 4 XPK workloads
    python -m tools.grid train.learning_rate=1e-4,3e-4 --on local:2          # 2 local processes, waited for
    python -m tools.grid status [ID]     # each variant: queued, running where, done, failed (its last line)
    python -m tools.grid pull [ID]       # every finished experiment here; then: dvc exp show
    (--dry-run: print the workers' commands and start nothing; python -m tools.plan --grid ...: the cost)

Every combination becomes one experiment, `dvc exp run -n NAME -S KEY=VALUE ...`, with NAME
spelling the values (e.g. `lr3e-4-steps80`; a switch by its section: `train.lora.enabled=true,false`
gives `lora` and `no-lora`), so `dvc exp show` rows say what they are. With --on, the grid
starts from this clone's HEAD (committed, pushed by the tool to refs/grid/<id>/base) and its
state lives on the git remote (tools/grid_board.py); the stages no variant changes run once,
on the first worker, and reach the others through the DVC remote's run-cache.
"""

import argparse
import copy
import hashlib
import itertools
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml
from dvc.utils.hydra import to_hydra_overrides
from hydra.errors import OverrideParseException

from stages.lib.cli import adopt_orphans, run
from stages.lib.dvc_yaml import declared
from stages.lib.params import load, plain, validate
from stages.shared.errors import StageFailed, UserError
from tools import grid_engines
from tools.grid_board import SHARED, Board, RemoteUnreachable
from tools.grid_worker import last_line, tool

# Short names for the params people sweep; anything else uses its last key.
ABBREVIATIONS = {
    "learning_rate": "lr",
    "per_device_batch_size": "bs",
    "gradient_accumulation_steps": "ga",
    "max_target_length": "len",
    "warmup_steps_fraction": "warmup",
    "rank": "lora-r",
}
# How often a worker moves its claim forward, and how long a silent one keeps it (seconds).
HEARTBEAT, STALE_AFTER, POLL = 60, 600, 30
LAST_GRID = Path(".dvc") / "tmp" / "grid" / "last"


def experiment_name(assignment: list[tuple[str, str]]) -> str:
    parts = []
    for key, value in assignment:
        *parents, leaf = key.split(".")
        if leaf == "enabled" and parents and value.lower() in ("true", "false"):
            # `lora` / `no-lora`, not `enabledtrue`
            parts.append(
                parents[-1].replace("_", "-") if value.lower() == "true" else f"no-{parents[-1].replace('_', '-')}"
            )
            continue
        parts.append(f"{ABBREVIATIONS.get(leaf, leaf.replace('_', '-'))}{value}")
    name = "-".join(parts)
    return "".join(c if c.isalnum() or c in "-." else "-" for c in name)  # a valid git ref name


def with_values(params: dict, assignment) -> dict:
    """params with KEY=VALUE applied, VALUE parsed as `dvc exp run -S` parses it (Hydra's
    override grammar: 1e-3 is a float, unlike in YAML)."""
    params = copy.deepcopy(params)
    for key, value in assignment:
        *parents, leaf = key.split(".")
        node = params
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"{key}: {part} is a value, not a section of params.yaml")
        try:
            node[leaf] = to_hydra_overrides([f"{key}={value}"])[0].value()
        except OverrideParseException as e:
            raise UserError(
                f"{key}={value}: not a value `dvc exp run -S` can parse: {str(e).splitlines()[0]}"
            ) from None
    return params


def expand(args: list[str], params: dict | None = None) -> dict[str, list[str]]:
    """{experiment name: ["KEY=VALUE", ...]} for KEY=V1,V2 arguments, every variant checked
    against the schema first (none would fail at its first second)."""
    axes = []
    for arg in args:
        key, _, values = arg.partition("=")
        if not values:
            raise UserError(f"{arg!r}: expected KEY=VALUE[,VALUE...], e.g. train.learning_rate=1e-3,3e-4")
        axes.append([(key, v) for v in values.split(",")])
    if not axes:
        raise UserError("usage: python -m tools.grid KEY=V1,V2 [KEY=V1,V2 ...] [--on ENGINE]")
    params = params if params is not None else plain(load())
    variants = {}
    for assignment in itertools.product(*axes):
        validate(with_values(params, assignment), " ".join(f"{k}={v}" for k, v in assignment))
        name = experiment_name(list(assignment))
        if name in variants:
            raise UserError(f"{' '.join(args)}: two variants would both be named {name}; give each value once")
        variants[name] = [f"{k}={v}" for k, v in assignment]
    return variants


def shared_stages(keys: list[str], dvc_yaml: str = "dvc.yaml") -> list[str]:
    """The stages no varied key reaches (neither a param they declare nor, through their deps,
    an output of a stage that one reaches) that a varied stage needs: run once for the grid."""
    with open(dvc_yaml) as f:
        stages = yaml.safe_load(f)["stages"]

    def paths(entries) -> list[str]:
        return [e if isinstance(e, str) else next(iter(e)) for e in entries or []]

    outs = {name: paths(s.get("outs")) + paths(s.get("metrics")) + paths(s.get("plots")) for name, s in stages.items()}

    def makers(name: str) -> set[str]:
        """The stages whose outputs `name` depends on."""
        deps = stages[name].get("deps", [])
        return {m for m in stages for o in outs[m] for d in deps if d == o or d.startswith(o.rstrip("/") + "/")}

    def reached(params: list[str]) -> bool:
        return any(k == p or k.startswith(p + ".") or p.startswith(k + ".") for k in keys for p in params)

    varied = set()
    for name in stages:  # dvc.yaml lists stages in the order they run
        if reached(declared(name, dvc_yaml)[0]) or makers(name) & varied:
            varied.add(name)
    needed, todo = set(), list(varied)
    while todo:
        for maker in makers(todo.pop()) - varied - needed:
            needed.add(maker)
            todo.append(maker)
    return [name for name in stages if name in needed]


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"git {' '.join(args)}: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout.strip()


def dvc_remote() -> tuple[str, str]:
    """(name, url) of the default DVC remote, with this clone's --local settings."""
    from dvc.repo import Repo

    config = Repo(".").config
    name = config["core"].get("remote")
    if not name:
        raise UserError("no default DVC remote: workers push their experiments' outputs there (docs/remote.md)")
    return name, config["remote"][name]["url"]


def check_startable(params: dict, engine: str, git_remote: str) -> tuple[str, str, str, str]:
    """What every worker needs, checked here before anything starts: (base commit, git URL,
    DVC remote name and URL). One line on the first thing missing."""
    if git("status", "--porcelain", "--untracked-files=no"):
        raise UserError("uncommitted changes: a grid runs from a commit (workers clone it); commit them first")
    if params["runtime"]["launcher"] != "local":
        raise UserError(
            f"runtime.launcher: {params['runtime']['launcher']}: a grid's worker runs each variant on its own "
            "machine (runtime.launcher local); for a slice's workers, one grid worker per slice is not built yet"
        )
    url = git("remote", "get-url", git_remote)
    remote_name, remote_url = dvc_remote()
    if not engine.startswith("local:"):
        if not params["runtime"]["scratch_dir"].startswith("gs://"):
            raise UserError(
                f"runtime.scratch_dir: {params['runtime']['scratch_dir']}: workers on other machines resume a "
                "taken-over variant from its checkpoints only on gs://; set runtime.scratch_dir: gs://BUCKET/scratch"
            )
        if Path(url).exists() or url.startswith("file:"):
            raise UserError(
                f"git remote {git_remote}: {url} is a path here, which workers on other machines cannot clone"
            )
        if not remote_url.startswith("gs://"):
            raise UserError(f"DVC remote {remote_name}: {remote_url}: workers on other machines need a gs:// remote")
    return git("rev-parse", "HEAD"), url, remote_name, remote_url


def parse_engine(on: str) -> tuple[str, list[str] | int]:
    kind, _, what = on.partition(":")
    if kind in ("local", "xpk") and what.isdigit() and int(what) > 0:
        return kind, int(what)
    if kind == "vm" and what and all(what.split(",")):
        return kind, what.split(",")
    raise UserError(f"--on {on}: expected local:N, xpk:N or vm:NAME[,NAME...]")


def launch(args, params: dict, variants: dict[str, list[str]]) -> None:
    kind, what = parse_engine(args.on)
    base, url, remote_name, remote_url = check_startable(params, args.on, args.git_remote)
    keys = sorted({s.split("=", 1)[0] for sets in variants.values() for s in sets})
    grid_id = hashlib.sha256(json.dumps([base, variants], sort_keys=True).encode()).hexdigest()[:10]
    spec = {
        "base": base,
        "variants": variants,
        "order": list(variants),  # (JSON objects lose theirs)
        "shared_stages": shared_stages(keys),
        "dvc_remote": remote_name,
        "dvc_remote_url": remote_url,
        "heartbeat": args.heartbeat,
        "stale_after": args.stale_after,
        "poll": args.poll,
    }
    if kind == "local":
        commands = grid_engines.local_workers(grid_id, what, Path.cwd(), url)
    elif kind == "vm":
        s = params["runtime"]["slice"]
        commands = grid_engines.vm_commands(grid_id, what, url, args.zone or s["zone"], args.project or s["project"])
    else:
        x = plain(params["runtime"]["xpk"])
        if not (x["cluster"] and x["docker_image"]):
            raise UserError("runtime.xpk.cluster and runtime.xpk.docker_image: set both for --on xpk (docs/sweeps.md)")
        commands = grid_engines.xpk_commands(grid_id, what, url, x, params["hardware"]["kind"])
    once = ", ".join(spec["shared_stages"]) or "none"
    header = f"grid {grid_id}: {len(variants)} variants from {base[:10]}; shared stages, run once: {once}"
    if args.dry_run:
        print(header)
        for name, cmd in commands.items():
            print(f"would start {name}: {shlex.join(cmd)}")
        return
    board = Board(".", grid_id, args.git_remote)
    again = not board.publish(spec, base)
    print(header + ("; already on the git remote: its workers continue it" if again else ""), flush=True)
    board.fetch()
    spec = board.spec()  # (the first run's, if this one continues a grid)
    if args.retry_failed:
        for variant in board.state().failed:
            board.forget_failure(variant)
    LAST_GRID.parent.mkdir(parents=True, exist_ok=True)
    LAST_GRID.write_text(grid_id)
    if kind == "local":
        run_local(board, spec, commands)
        return
    for name, cmd in commands.items():
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StageFailed(f"starting worker {name}: {(proc.stderr or proc.stdout).strip()[-500:]}")
        print(f"grid {grid_id}: started worker {name}")
    print(f"follow it: python -m tools.grid status {grid_id}; then: python -m tools.grid pull {grid_id}")


def run_local(board: Board, spec: dict, commands: dict[str, list[str]]) -> None:
    """Runs the local workers to the end, each in its own session (so that a test, or the user,
    can kill one and everything under it), starting again any that a signal killed."""
    logs = Path(".dvc") / "tmp" / "grid" / board.grid_id
    logs.mkdir(parents=True, exist_ok=True)
    restarts = dict.fromkeys(commands, 0)
    # What a killed worker started goes to init, which reaps it. Adopted here and never reaped,
    # a dead `dvc exp run` would stay a zombie, whose pid DVC's lock file takes for a live
    # holder: the restarted worker's run of the same clone would be refused.
    adopt_orphans(False)

    def start(name: str) -> subprocess.Popen:
        with open(logs / f"{name}.log", "a") as log:
            return subprocess.Popen(commands[name], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    running = {name: start(name) for name in commands}
    shown: dict[str, str] = {}
    try:
        while running:
            time.sleep(2)
            for name, proc in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[name]
                if code < 0 and restarts[name] < grid_engines.RESTARTS:
                    restarts[name] += 1
                    print(f"grid: worker {name} killed (signal {-code}); starting it again", flush=True)
                    running[name] = start(name)
                elif code != 0:
                    print(f"grid: worker {name} exited {code}: {last_line(logs / f'{name}.log')}", flush=True)
            shown = _show_changes(board, spec, shown)
    finally:
        for proc in running.values():
            proc.terminate()
    lines = status_lines(board, spec)
    print("\n".join(lines))
    done = [v for v in spec["order"] if v in board.state().done]
    if done:
        pull(board, spec)
    missing = len(spec["variants"]) - len(done)
    if missing:
        raise StageFailed(f"grid {board.grid_id}: {missing} of {len(spec['variants'])} variants did not finish (above)")


def _show_changes(board: Board, spec: dict, shown: dict) -> dict:
    """Prints each variant whose state changed since `shown`; returns the states now."""
    try:
        state = board.refresh()
    except RemoteUnreachable:  # the next look will tell
        return shown
    now = {v: state.describe(v, time.time(), spec["stale_after"]).split(" (heartbeat")[0] for v in _rows(spec)}
    for variant, what in now.items():
        if shown.get(variant) != what:
            print(f"grid: {variant}: {what}", flush=True)
    return now


def _rows(spec: dict) -> list[str]:
    return ([SHARED] if spec["shared_stages"] else []) + spec["order"]


def status_lines(board: Board, spec: dict, fetch: bool = True) -> list[str]:
    state = board.refresh() if fetch else board.state()
    now, stale_after = time.time(), spec["stale_after"]
    variants = _rows(spec)
    width = max(len(v) for v in variants)
    lines = [f"grid {board.grid_id}: {len(spec['variants'])} variants from {spec['base'][:10]}"]
    return lines + [f"  {v:<{width}}  {state.describe(v, now, stale_after)}" for v in variants]


def grid_of(arg: str | None, git_remote: str) -> Board:
    grid_id = arg or (LAST_GRID.read_text().strip() if LAST_GRID.exists() else None)
    if not grid_id:
        raise UserError("which grid? python -m tools.grid status ID (ids: git ls-remote origin 'refs/grid/*/spec')")
    board = Board(".", grid_id, git_remote)
    board.fetch()
    return board


def pull(board: Board, spec: dict, outputs: bool = False) -> None:
    """Every finished experiment of the grid into this clone (`dvc exp pull`): its git ref,
    hence its params and metrics for `dvc exp show`; with outputs, its cached outputs too."""
    done = [v for v in spec["order"] if v in board.state().done]
    if not done:
        print(f"grid {board.grid_id}: nothing finished yet")
        return
    cmd = ["dvc", "exp", "pull", board.remote, *done, *([] if outputs else ["--no-cache"])]
    proc = subprocess.run([tool("dvc"), *cmd[1:]], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StageFailed(f"{' '.join(cmd)}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    print(
        f"grid {board.grid_id}: pulled {', '.join(done)}; compare: dvc exp show --only-changed"
        + ("" if outputs else "; weights: dvc exp apply NAME && dvc pull")
    )


def queue(variants: dict[str, list[str]]) -> None:
    for name, sets in variants.items():
        cmd = ["dvc", "exp", "run", "--queue", "-n", name, "-m", "grid: " + ", ".join(sets)]
        for s in sets:
            cmd += ["-S", s]
        subprocess.run(cmd, check=True)
        print(f"grid: queued {name}  ({', '.join(sets)})", flush=True)
    print("grid: run them with: dvc queue start   (then: dvc queue status, dvc exp show)")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("axes", nargs="*", help="KEY=V1,V2 ...; or: status [ID], pull [ID]")
    parser.add_argument("--on", help="local:N | vm:NAME[,NAME...] | xpk:N (default: queue here for dvc queue start)")
    parser.add_argument("--dry-run", action="store_true", help="print the workers' commands; start nothing")
    parser.add_argument("--git-remote", default="origin", help="the git remote workers clone and push to")
    parser.add_argument("--zone", help="the TPU VMs' zone (default: runtime.slice.zone)")
    parser.add_argument("--project", help="the TPU VMs' project (default: runtime.slice.project)")
    parser.add_argument("--retry-failed", action="store_true", help="run the grid's failed variants again")
    parser.add_argument("--outputs", action="store_true", help="pull: their outputs too, not only refs")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT, help=argparse.SUPPRESS)
    parser.add_argument("--stale-after", type=float, default=STALE_AFTER, help=argparse.SUPPRESS)
    parser.add_argument("--poll", type=float, default=POLL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.axes and args.axes[0] in ("status", "pull"):
        board = grid_of(args.axes[1] if len(args.axes) > 1 else None, args.git_remote)
        spec = board.spec()
        if args.axes[0] == "status":
            print("\n".join(status_lines(board, spec, fetch=False)))
        else:
            pull(board, spec, args.outputs)
        return
    params = load()  # refuse to start anything from an invalid params.yaml ...
    variants = expand(args.axes, plain(params))  # ... or any variant that would fail at its first second
    if args.on:
        launch(args, params, variants)
    else:
        queue(variants)


if __name__ == "__main__":
    run(main, "grid")
