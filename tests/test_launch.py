"""The training stages' launchers (stages/lib/launch.py) as commands: every worker of a job runs
one line, told only its place in the job; the XPK workload is one xpk's own parser accepts;
no credential is in any of them. The two-process run itself: tests/test_multihost.py."""

import dataclasses
import fnmatch
import json
import os
import shlex
import subprocess

import pytest

from stages.lib import flags, launch
from stages.shared import contract
from testkit.workspace import REPO

XPK_PYTHON = REPO / ".venv-xpk" / "bin" / "python"  # scripts/setup.sh
TOKEN = "hf_launchtestsecret0123456789"


@pytest.fixture
def slice_16(project_4b, monkeypatch):
    """The 4B recipe on a v6e-16 (4 hosts), staged inputs as the train stage names them."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    p = project_4b
    p["hardware"].update(kind="v6e-16", hosts=4, tpu_env=None)
    p["runtime"].update(scratch_dir="gs://b/scratch", launcher="slice")
    p["runtime"]["slice"].update(name="sft-slice", zone="us-east5-b", project="my-project")
    p["runtime"]["xpk"].update(
        cluster="sft-cluster",
        docker_image="us-docker.pkg.dev/my-project/sft/trainer:1",
        zone="us-east5-b",
        project="my-project",
    )
    staged = flags.Staged(
        "gs://b/scratch/inputs/base-maxtext-0/items",
        ".scratch/train-0/worker-inputs/files",
        ".scratch/train-0/worker-inputs/files/eval.jsonl",
        {"gs://b/scratch/inputs/files-0": ".scratch/train-0/worker-inputs/files"},
    )
    job = flags.train(
        p,
        "gs://b/scratch/train-0",
        ".scratch/train-0/metrics.jsonl",
        ".scratch/train-0/worker-inputs/from-step-0/host-*.jsonl",
        staged,
    )
    return p, job


def command_line(worker) -> str:
    flag = next(a for a in worker.command if a.startswith("--command="))
    return flag.removeprefix("--command=")


def test_every_worker_of_a_slice_runs_the_same_line_over_gcloud_ssh(slice_16):
    p, job = slice_16
    workers = launch.workers("train", job, p)
    assert [w.command[:7] for w in workers] == [
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "sft-slice", f"--worker={i}"] for i in range(4)
    ]
    assert {"--zone=us-east5-b", "--project=my-project"} <= set(workers[0].command)
    lines = {command_line(w) for w in workers}
    assert len(lines) == 1  # on TPUs each host learns its place from the TPU runtime
    argv = shlex.split(lines.pop())
    assert argv[:3] == ["cd", os.getcwd(), "&&"] and argv[3:5] == ["exec", "env"]
    assert ".venv/bin/python" in argv and "maxtext:configs/post_train/sft.yml" in argv
    assert "HF_HUB_OFFLINE=1" in argv and not [a for a in argv if a.startswith("TPU_")]
    assert [w.log_path for w in workers] == [f"logs/train.worker-{i}.log" for i in range(4)]
    stop = launch.stop_slice(p)
    assert stop[5:7] == ["sft-slice", "--worker=all"] and "pkill -f stages.in_maxtext.main" in " ".join(stop)


def test_cpu_processes_are_told_their_place_as_xpk_tells_cpu_workloads(project_4b):
    p = project_4b
    p["hardware"].update(kind="cpu", hosts=2, tpu_env=None)
    p["runtime"].update(scratch_dir="gs://b/scratch", launcher="local")
    job = flags.train(p, "gs://b/scratch/train-0", ".scratch/train-0/metrics.jsonl", "host-*.jsonl")
    first, second = (shlex.split(w.command[2]) for w in launch.workers("train", job, p))
    assert [w.command[:2] for w in launch.workers("train", job, p)] == [["bash", "-c"]] * 2
    differing = [(a, b) for a, b in zip(first, second, strict=True) if a != b]
    assert differing == [
        ("JOB_COMPLETION_INDEX=0", "JOB_COMPLETION_INDEX=1"),
        ("metrics_file=.scratch/train-0/metrics.jsonl", "metrics_file=.scratch/train-0/metrics.jsonl.worker-1"),
    ]
    assert {
        "JAX_COORDINATOR_ADDRESS=localhost",
        "JOB_INDEX=0",
        "PROCESSES_IN_JOB=2",
        "JAX_PROCESS_COUNT=2",
        "JAX_PLATFORMS=cpu",
    } <= set(first)


def test_the_xpk_workload_is_one_xpks_own_parser_accepts(slice_16):
    p, job = slice_16
    p["runtime"]["launcher"] = "xpk"
    assert XPK_PYTHON.exists(), "no .venv-xpk: run scripts/setup.sh"
    workload = launch.workload_name("train-0123456789abcdef")
    create, wait = launch.xpk_create(p, job, workload), launch.xpk_wait(p, workload)
    parsed = json.loads(
        subprocess.run(
            [str(XPK_PYTHON), str(REPO / "tests" / "xpk_parse.py"), json.dumps([create, wait, create[:4]])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert parsed[0]["verb"] == "create" and parsed[0]["workload"] == workload == "sft-0123456789abcdef"
    assert (parsed[0]["cluster"], parsed[0]["tpu_type"], parsed[0]["num_slices"], parsed[0]["zone"]) == (
        "sft-cluster",
        "v6e-16",
        1,
        "us-east5-b",
    )
    assert parsed[0]["docker_image"] == "us-docker.pkg.dev/my-project/sft/trainer:1"
    assert shlex.split(parsed[0]["command"])[:3] == ["cd", "/app", "&&"]  # the image's project (Dockerfile)
    assert parsed[0]["max_restarts"] == "0"  # a re-run of the stage resumes (its stream must follow the checkpoint)
    assert parsed[1]["verb"] == "list" and parsed[1]["wait_for_job_completion"] == workload
    assert "required" in parsed[2]["error"]  # the parser does check: a command cut short is refused


def test_preference_tuning_runs_on_the_same_launchers_from_the_staged_sft_model(slice_16):
    p, _ = slice_16
    p["preference"]["enabled"] = True
    files = ".scratch/preference-0/worker-inputs/files"
    staged = flags.Staged(
        "gs://b/scratch/inputs/sft-maxtext-0/params",
        files,
        f"{files}/eval.jsonl",
        {"gs://b/scratch/inputs/files-1": files},
    )
    streams = ".scratch/preference-0/worker-inputs/from-step-0/host-*.jsonl"
    job = flags.preference(p, "gs://b/scratch/preference-0", ".scratch/preference-0/metrics.jsonl", streams, staged)
    workers = launch.workers("preference", job, p)
    assert len({command_line(w) for w in workers}) == 1 and len(workers) == 4
    argv = shlex.split(command_line(workers[0]))
    setup = contract.decode(argv[argv.index("--setup") + 1], contract.Setup)
    assert "maxtext:configs/post_train/dpo.yml" in argv and setup.fetch == {"gs://b/scratch/inputs/files-1": files}
    # Every input from gs:// or the worker's own copy of it: no path of this machine.
    assert {
        "load_parameters_path=gs://b/scratch/inputs/sft-maxtext-0/params",
        f"hf_train_files={streams}",
        f"tokenizer_path={files}",
        f"hf_eval_files={files}/eval.jsonl",
    } <= set(argv)
    assert [w.log_path for w in workers] == [f"logs/preference.worker-{i}.log" for i in range(4)]
    # On XPK, a workload named by the stage's working directory, which xpk's parser accepts.
    p["runtime"]["launcher"] = "xpk"
    workload = launch.workload_name("preference-0123456789abcdef")
    assert workload == "preference-0123456789abcdef"
    create = launch.xpk_create(p, job, workload)
    parsed = json.loads(
        subprocess.run(
            [str(XPK_PYTHON), str(REPO / "tests" / "xpk_parse.py"), json.dumps([create])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert parsed[0]["workload"] == workload and "preference-0" in launch.describe(p, job, workload, "preference")


@pytest.mark.parametrize(("launcher", "hosts"), [("xpk", 1), ("slice", 4)])
def test_each_worker_reads_the_streams_the_stage_writes_and_uploads(project_4b, launcher, hosts):
    """A job's workers read `<their copy>/host-*.jsonl`: the stage writes one stream a host in
    the layout it uploads, a single-host v6e-8 on XPK too, and after a resume likewise."""
    from stages.lib import train_data, workdir

    p = project_4b
    if hosts > 1:
        p["hardware"].update(kind="v6e-16", hosts=hosts, tpu_env=None)
    p["runtime"].update(scratch_dir="gs://b/scratch", launcher=launcher)
    work = workdir.Workdir("gs://b/scratch", "train-0", inputs={"made": "by"})
    for step in (0, 20):
        names = train_data.resumed_names(p, work, step)
        assert len(names) == hosts and len({os.path.dirname(n) for n in names}) == 1
        train_file, staged = train_data.stage(p, work, names, train_data.SFT, upload=False)
        streams_url, copy = next((url, local) for url, local in staged.fetch.items() if url.startswith(work.url))
        # What is uploaded (each name, into streams_url) lands in the worker's copy, where the glob finds it.
        assert os.path.dirname(train_file) == copy and streams_url.endswith(f"/from-step-{step}")
        assert all(fnmatch.fnmatch(os.path.basename(n), os.path.basename(train_file)) for n in names)
    assert train_data.stream_names(p, work) == train_data.resumed_names(p, work, 0)


def test_no_credential_is_in_any_worker_command(slice_16):
    p, job = slice_16
    shown = [launch.describe(p, job, "train-0")]
    p["runtime"]["launcher"] = "xpk"
    shown.append(launch.describe(p, job, "train-0"))
    assert "gcloud compute tpus tpu-vm ssh sft-slice --worker=3" in shown[0] and "xpk workload create" in shown[1]
    assert not [s for s in shown if TOKEN in s]
    p["runtime"]["launcher"] = "slice"
    assert not [w for w in launch.workers("train", job, p) if "HF_TOKEN" in w.env or TOKEN in " ".join(w.command)]


def test_every_maxtext_process_asks_for_huge_pages_unless_told_otherwise(slice_16, monkeypatch):
    """glibc's malloc with transparent huge pages (stages/lib/maxtext_process.py; bench/malloc.py):
    on every worker's line, added to tunables of the machine's own, and off when they say so."""
    from stages.lib import maxtext_process

    p, job = slice_16
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    argv = shlex.split(command_line(launch.workers("train", job, p)[0]))
    assert "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in argv
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert maxtext_process.child_env(p)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    assert maxtext_process.child_env(p)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_a_workers_own_metrics_file_changes_nothing_else_of_its_invocation():
    job = flags.Invocation(
        contract.TRAIN_SFT,
        ["a=1", "metrics_file=m.jsonl"],
        contract.Setup(model_name="n", hf_config="h", hf_layout="l", fetch={"gs://b/x": "x"}),
        env={"E": "1"},
    )
    own = launch._own_metrics_file(job, 1)
    assert own.args == ["a=1", "metrics_file=m.jsonl.worker-1"]
    assert dataclasses.replace(own, args=job.args) == job
