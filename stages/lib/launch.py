"""Where a training stage's MaxText job runs (train's, preference's), chosen by the recipe
(runtime.launcher).

    local   this machine: one process, or hardware.hosts processes forming one
            multi-controller JAX job on 127.0.0.1 (how the tests prove a multi-host run on CPU)
    slice   every worker of the TPU VM slice runtime.slice, each through
            `gcloud compute tpus tpu-vm ssh NAME --worker=i --command=...`
    xpk     one XPK workload on the GKE cluster runtime.xpk: `xpk workload create`

DVC runs where the user runs `dvc repro`: this machine, worker 0 of the slice, or any machine
with the cluster's credentials for XPK. A job of several processes is the same shell line on
every worker (`worker_line`); only its transport differs: `bash -c` here, gcloud's ssh on a
slice. So the tests' two local processes run exactly what a slice's workers run.

Each worker learns which process of the job it is from its environment. CPU jobs get the
variables XPK gives CPU workloads and MaxText reads (max_utils.initialize_jax_for_cpu:
JAX_COORDINATOR_ADDRESS, JOB_INDEX, JOB_COMPLETION_INDEX, PROCESSES_IN_JOB, JAX_PROCESS_COUNT;
its coordinator port is fixed at 1234, so one such job at a time per machine). On TPUs, JAX
finds its peers from the TPU runtime itself.
"""

import dataclasses
import os
import shlex
import subprocess
import sys

from stages.lib import hardware, maxtext_process
from stages.lib.flags import Invocation
from stages.shared.errors import StageFailed

WORKLOAD_PREFIX = "sft-"  # in place of train's "train-" (the preference stage's name stays)


def one_process(params: dict) -> bool:
    """Whether a training stage runs as one MaxText process on this machine (maxtext_process.run), not
    as a job of one process per host (run)."""
    return hardware.hosts(params) == 1 and params["runtime"]["launcher"] == "local"


def process_env(params: dict, index: int) -> dict[str, str]:
    """What tells worker `index` which process of a CPU job it is (see the module docstring)."""
    hosts = hardware.hosts(params)
    if not hardware.on_cpu(params) or hosts == 1:
        return {}
    return {
        "JAX_COORDINATOR_ADDRESS": "localhost",
        "JOB_INDEX": "0",
        "JOB_COMPLETION_INDEX": str(index),
        "PROCESSES_IN_JOB": str(hosts),
        "JAX_PROCESS_COUNT": str(hosts),
    }


def worker_line(invocation: Invocation, env: dict[str, str], project_dir: str, python: str) -> str:
    """The shell line a worker runs: in the project's directory there, with exactly `env` set on
    top of its own (the recipe's settings, never a credential: maxtext_process.job_env), exec'd so that
    stopping the transport stops MaxText."""
    assigned = [f"{k}={v}" for k, v in sorted(env.items())]
    return f"cd {shlex.quote(project_dir)} && exec " + shlex.join(
        ["env", *assigned, python, *maxtext_process.command(invocation)[1:]]
    )


def _own_metrics_file(invocation: Invocation, index: int) -> Invocation:
    """Worker `index`'s copy for a job whose workers share one disk: every MaxText process writes
    its metrics_file, so each but the first gets its own (the stage follows worker 0's)."""
    if index == 0:
        return invocation
    args = [f"{a}.worker-{index}" if a.startswith("metrics_file=") else a for a in invocation.args]
    return dataclasses.replace(invocation, args=args)


def transport(params: dict, index: int, line: str) -> list[str]:
    """How the line reaches worker `index`: a shell here, or gcloud's ssh to the slice's worker."""
    if params["runtime"]["launcher"] == "slice":
        s = params["runtime"]["slice"]
        return [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            s["name"],
            f"--worker={index}",
            f"--command={line}",
            *[f"--{k}={s[k]}" for k in ("zone", "project") if s.get(k)],
        ]
    return ["bash", "-c", line]


def workers(stage: str, invocation: Invocation, params: dict) -> list[maxtext_process.Worker]:
    """The job's processes, one per host (local or slice launcher)."""
    hosts, on_slice = hardware.hosts(params), params["runtime"]["launcher"] == "slice"
    python = ".venv/bin/python" if on_slice else sys.executable  # scripts/setup-tpu.sh's, on every worker
    out = []
    for i in range(hosts):
        mine = invocation if on_slice else _own_metrics_file(invocation, i)
        env = {**maxtext_process.job_env(params), **mine.env, **process_env(params, i)}
        log = os.path.join(maxtext_process.LOG_DIR, f"{stage}.worker-{i}.log")
        line = worker_line(mine, env, os.getcwd(), python)
        out.append(
            maxtext_process.Worker(
                f"worker {i} of {hosts}", transport(params, i, line), maxtext_process.child_env(params), log
            )
        )
    return out


def stop_slice(params: dict) -> list[str]:
    """Stops whatever MaxText the job left on the slice's workers (ending an ssh session does not)."""
    s = params["runtime"]["slice"]
    return [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        s["name"],
        "--worker=all",
        "--command=pkill -f stages.in_maxtext.main || true",
        *[f"--{k}={s[k]}" for k in ("zone", "project") if s.get(k)],
    ]


def workload_name(work_name: str) -> str:
    """XPK's workload name for a working directory (lower case, at most 40 characters):
    sft-<digest> for train's, preference-<digest> for the preference stage's."""
    if work_name.startswith("train-"):
        work_name = WORKLOAD_PREFIX + work_name.removeprefix("train-")
    return work_name[:40]


def xpk_create(params: dict, invocation: Invocation, workload: str) -> list[str]:
    """`xpk workload create` for the job: every pod of the workload runs the same line, in the
    image's project directory (/app, Dockerfile)."""
    x = params["runtime"]["xpk"]
    line = worker_line(invocation, {**maxtext_process.job_env(params), **invocation.env}, "/app", ".venv/bin/python")
    return [
        "xpk",
        "workload",
        "create",
        f"--cluster={x['cluster']}",
        f"--workload={workload}",
        f"--docker-image={x['docker_image']}",
        f"--tpu-type={params['hardware']['kind']}",
        "--num-slices=1",
        # Not restarted by XPK: a restart would rerun the same line, with the stream from
        # its start against a later checkpoint. `dvc repro` again resumes it correctly.
        "--max-restarts=0",
        f"--command={line}",
        *[f"--{k}={x[k]}" for k in ("project", "zone") if x.get(k)],
    ]


def xpk_wait(params: dict, workload: str) -> list[str]:
    """Blocks until the workload ends; exits non-zero when it failed."""
    x = params["runtime"]["xpk"]
    return [
        "xpk",
        "workload",
        "list",
        f"--cluster={x['cluster']}",
        f"--wait-for-job-completion={workload}",
        *[f"--{k}={x[k]}" for k in ("project", "zone") if x.get(k)],
    ]


def run(
    stage: str,
    invocation: Invocation,
    params: dict,
    work_name: str,
    progress=None,
    on_disk_full: str = hardware.FULL_DISK_ADVICE,
    finished=None,
) -> None:
    """Runs the training on the recipe's launcher and waits for it: one process on this machine
    (maxtext_process.run), or a job of one per host. A failed or killed worker stops the job and the
    error names it (maxtext_process.run_workers)."""
    if one_process(params):
        maxtext_process.run(stage, invocation, params, progress=progress, on_disk_full=on_disk_full, finished=finished)
        return
    launcher = params["runtime"]["launcher"]
    if launcher == "xpk":
        workload = workload_name(work_name)
        created = subprocess.run(
            xpk_create(params, invocation, workload),
            env=maxtext_process.child_env(params),
            capture_output=True,
            text=True,
        )
        if created.returncode != 0:
            raise StageFailed(f"xpk workload create failed: {(created.stderr or created.stdout).strip()[-2000:]}")
        log = os.path.join(maxtext_process.LOG_DIR, f"{stage}.xpk.log")
        # No step lines: the metrics file MaxText writes is inside the workload's pods.
        print(
            f"{stage}: XPK workload {workload} created; its logs: xpk workload list --cluster="
            f"{params['runtime']['xpk']['cluster']} (Cloud Logging link there)",
            flush=True,
        )
        waiter = maxtext_process.Worker(
            f"XPK workload {workload}", xpk_wait(params, workload), maxtext_process.child_env(params), log
        )
        maxtext_process.run_workers(stage, invocation.module, [waiter])
        return
    try:
        maxtext_process.run_workers(
            stage,
            invocation.module,
            workers(stage, invocation, params),
            progress,
            on_oom=maxtext_process.memory_advice(stage, params),
            on_disk_full=on_disk_full,
            finished=finished,
        )
    except BaseException:
        if launcher == "slice":
            subprocess.run(stop_slice(params), env=maxtext_process.child_env(params), capture_output=True)
        raise


def dry_run(stage: str, invocation: Invocation, params: dict, work_name: str) -> None:
    """--dry-run of a training stage: the exact command of its process, or of every worker of
    its job (XPK's), printed, and MaxText's validation of it."""
    maxtext_process.dry_run(
        stage, invocation, params, plan=None if one_process(params) else describe(params, invocation, work_name, stage)
    )


def describe(params: dict, invocation: Invocation, work_name: str, stage: str = "train") -> str:
    """What --dry-run prints for a job: the exact command of every worker, or XPK's."""
    if params["runtime"]["launcher"] == "xpk":
        return "would create the XPK workload:\n  " + shlex.join(
            xpk_create(params, invocation, workload_name(work_name))
        )
    lines = [f"  {w.name}: {shlex.join(w.command)}" for w in workers(stage, invocation, params)]
    return "would run on every worker:\n" + "\n".join(lines)
