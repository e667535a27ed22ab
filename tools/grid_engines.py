"""Where a grid's workers run (`python -m tools.grid ... --on ENGINE`): each worker is
`python -m tools.grid_worker` in a clone of its own; only how it is started differs.

    local:N          N processes on this machine, each in its own clone under
                     .dvc/tmp/grid/<id>/ (the tests' engine; also a workstation's). Waited for:
                     a worker killed by a signal is started again, as XPK restarts a pod.
    vm:NAME[,NAME]   one worker per TPU VM, started over `gcloud compute tpus tpu-vm ssh NAME
                     --worker=0` (as the slice launcher reaches its workers), detached: it
                     clones the project into ~/grid/<id>, runs scripts/setup-tpu.sh there, and
                     runs on after the ssh session ends. Its output: ~/grid/<id>.log on the VM.
    xpk:N            N XPK workloads (the project's Dockerfile image, runtime.xpk's cluster),
                     each one worker on one TPU slice of hardware.kind; restarted by XPK up to
                     RESTARTS times (it then takes its own claim back).

Nothing secret travels: workers on VMs and GKE use their machine's Google credentials for the
bucket and clone the git remote with what that machine has; a local worker gets a copy of the
user's .dvc/config.local.
"""

import shlex
import sys
from pathlib import Path

RESTARTS = 3


def worker_command(grid_id: str, worker: str, clone: str, remote_url: str | None, python: str) -> list[str]:
    return [
        python,
        "-m",
        "tools.grid_worker",
        f"--grid={grid_id}",
        f"--worker={worker}",
        f"--dir={clone}",
        *([f"--remote={remote_url}"] if remote_url else []),
    ]


def local_workers(grid_id: str, count: int, project: Path, remote_url: str) -> dict[str, list[str]]:
    """{worker name: command} for `local:N`, each with its own clone under the project's .dvc/tmp."""
    base = project / ".dvc" / "tmp" / "grid" / grid_id
    config_local = project / ".dvc" / "config.local"
    extra = [f"--dvc-config-local={config_local}"] if config_local.exists() else []
    names = [f"local-{i}" for i in range(1, count + 1)]
    return {n: [*worker_command(grid_id, n, str(base / n), remote_url, sys.executable), *extra] for n in names}


def vm_line(grid_id: str, vm: str, remote_url: str) -> str:
    """The shell line a TPU VM runs: its own clone at the grid's base, set up, the worker
    started in the background (nohup: it outlives the ssh session)."""
    clone = f"~/grid/{grid_id}"
    worker = shlex.join(worker_command(grid_id, vm, ".", None, ".venv/bin/python"))
    return (
        f"mkdir -p ~/grid"
        f" && {{ test -d {clone}/.git || git clone -q --no-checkout {shlex.quote(remote_url)} {clone}; }}"
        f" && cd {clone} && git fetch -q origin '+refs/grid/{grid_id}/*:refs/grid/{grid_id}/*'"
        f" && git checkout -q --force --detach refs/grid/{grid_id}/base"
        f" && bash scripts/setup-tpu.sh >> {clone}.setup.log 2>&1"
        f" && (nohup {worker} >> {clone}.log 2>&1 < /dev/null &)"
    )


def vm_commands(grid_id: str, vms: list[str], remote_url: str, zone: str | None, project: str | None) -> dict:
    return {
        vm: [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            vm,
            "--worker=0",
            f"--command={vm_line(grid_id, vm, remote_url)}",
            *([f"--zone={zone}"] if zone else []),
            *([f"--project={project}"] if project else []),
        ]
        for vm in vms
    }


def xpk_commands(grid_id: str, count: int, remote_url: str, xpk: dict, tpu_type: str) -> dict:
    """{workload name: `xpk workload create`}: the image's project (/app, the Dockerfile) runs
    the worker, which clones the grid's base into /tmp/grid."""
    out = {}
    for i in range(1, count + 1):
        name = f"grid-{grid_id}-{i}"[:40]
        worker = worker_command(grid_id, name, "/tmp/grid", remote_url, ".venv/bin/python")
        line = "cd /app && exec " + shlex.join(worker)
        out[name] = [
            "xpk",
            "workload",
            "create",
            f"--cluster={xpk['cluster']}",
            f"--workload={name}",
            f"--docker-image={xpk['docker_image']}",
            f"--tpu-type={tpu_type}",
            "--num-slices=1",
            f"--max-restarts={RESTARTS}",  # a preempted slice comes back and takes its variant again
            f"--command={line}",
            *[f"--{k}={xpk[k]}" for k in ("project", "zone") if xpk.get(k)],
        ]
    return out
