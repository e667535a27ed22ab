"""A grid's workers on TPU VMs and XPK, checked as far as this machine can: the commands
`python -m tools.grid ... --on vm:...|xpk:N --dry-run` prints, the XPK ones read by xpk's own
parser, the VM's shell line by bash, every worker's arguments by the worker's own parser; and
what the tool refuses before it starts anything. (Workers running a grid for real, as local
processes: tests/test_grid_run.py.)"""

import json
import shlex
import shutil
import subprocess

import pytest
import yaml

from stages.shared.errors import UserError
from testkit.workspace import GIT_ID, REPO
from tools import grid, grid_worker
from tools.recipe import params_text

XPK_PYTHON = REPO / ".venv-xpk" / "bin" / "python"
GIT_URL = "https://git.example.com/team/sft.git"
AXES = ["train.learning_rate=1e-4,3e-4", "train.lora.enabled=true,false"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The 4B recipe's files as a committed clone of GIT_URL, set up for a grid on TPUs (no
    pipeline run: nothing is started)."""
    params = yaml.safe_load(params_text("gemma3-4b-v6e-8"))
    params["runtime"]["scratch_dir"] = "gs://team-bucket/scratch"
    params["runtime"]["slice"].update(zone="us-east5-b", project="team-project")
    params["runtime"]["xpk"].update(cluster="sft-cluster", docker_image="us-docker.pkg.dev/team-project/sft/trainer:1")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copy(REPO / "dvc.yaml", tmp_path)
    shutil.copytree(REPO / ".dvc", tmp_path / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache", "config.local"))
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "p"], ["remote", "add", "origin", GIT_URL]):
        subprocess.run(["git", *GIT_ID, *cmd], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def dry_run(capsys, *args: str) -> dict[str, list[str]]:
    """{worker: its command} as --dry-run printed them."""
    grid.main([*AXES, "--dry-run", *args])
    out = capsys.readouterr().out
    assert "shared stages, run once: base_model, dataset, constraints, token_lengths, convert_in" in out, out
    return {
        line.split()[2].rstrip(":"): shlex.split(line.split(": ", 1)[1])
        for line in out.splitlines()
        if line.startswith("would start ")
    }


def worker_args(line: str) -> tuple[list[str], object]:
    """The shell words before the worker, and the worker's arguments as its own parser reads them."""
    words = shlex.split(line)
    at = words.index("tools.grid_worker")
    end = next((i for i, w in enumerate(words) if i > at and w.startswith(">")), len(words))  # its redirection
    return words[: at - 1], grid_worker.parser().parse_args(words[at + 1 : end])


def test_each_vm_gets_one_worker_over_gcloud_ssh_that_outlives_the_session(project, capsys):
    commands = dry_run(capsys, "--on", "vm:tpu-a,tpu-b")
    assert list(commands) == ["tpu-a", "tpu-b"]
    for vm, cmd in commands.items():
        assert cmd[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", vm, "--worker=0"]
        assert cmd[8:] == ["--zone=us-east5-b", "--project=team-project"]  # runtime.slice's
        line = cmd[7].removeprefix("--command=")
        assert subprocess.run(["bash", "-n", "-c", line]).returncode == 0  # bash reads it
        before, args = worker_args(line)
        grid_id = args.grid
        assert (args.worker, str(args.dir), args.remote) == (vm, ".", None)  # the name it takes its claims back by
        assert f"git clone -q --no-checkout {GIT_URL} ~/grid/{grid_id}" in line
        assert f"git checkout -q --force --detach refs/grid/{grid_id}/base" in line
        assert "bash scripts/setup-tpu.sh" in line  # the VM's environment, as docs/tpu-vm.md sets it up
        assert line.endswith(f">> ~/grid/{grid_id}.log 2>&1 < /dev/null &)") and "(nohup .venv/bin/python" in line


def test_each_xpk_workload_is_one_worker_xpks_own_parser_accepts(project, capsys):
    commands = dry_run(capsys, "--on", "xpk:3")
    assert XPK_PYTHON.exists(), "no .venv-xpk: run scripts/setup.sh"
    parsed = json.loads(
        subprocess.run(
            [str(XPK_PYTHON), str(REPO / "tests" / "xpk_parse.py"), json.dumps(list(commands.values()))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert len(parsed) == 3 and not any("error" in p for p in parsed), parsed
    for name, p in zip(commands, parsed, strict=True):
        assert p["workload"] == name and len(name) <= 40
        assert (p["cluster"], p["tpu_type"], p["num_slices"], p["max_restarts"]) == ("sft-cluster", "v6e-8", 1, "3")
        assert p["docker_image"] == "us-docker.pkg.dev/team-project/sft/trainer:1"
        before, args = worker_args(p["command"])
        assert before == ["cd", "/app", "&&", "exec", ".venv/bin/python"]  # the image's project (Dockerfile)
        assert (args.worker, str(args.dir), args.remote) == (name, "/tmp/grid", GIT_URL)
    assert len({p["workload"] for p in parsed}) == 3


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("scratch", "runtime.scratch_dir: /tmp/s: workers on other machines resume a taken-over variant"),
        ("launcher", "runtime.launcher: slice: a grid's worker runs each variant on its own machine"),
        ("uncommitted", "uncommitted changes: a grid runs from a commit"),
        ("local remote", "is a path here, which workers on other machines cannot clone"),
        ("engine", "--on tpu:2: expected local:N, xpk:N or vm:NAME[,NAME...]"),
        ("values", "train.learning_rate=-1: train.learning_rate: expected a number > 0"),
    ],
)
def test_a_grid_that_cannot_run_is_refused_before_anything_starts(project, capsys, change, said):
    params = yaml.safe_load((project / "params.yaml").read_text())
    on, axes = "vm:tpu-a", AXES
    if change == "scratch":
        params["runtime"]["scratch_dir"] = "/tmp/s"
    elif change == "launcher":
        params["runtime"].update(launcher="slice", slice={**params["runtime"]["slice"], "name": "sft-slice"})
    elif change == "local remote":
        subprocess.run(["git", "remote", "set-url", "origin", str(project)], check=True)
    elif change == "engine":
        on = "tpu:2"
    elif change == "values":
        axes = ["train.learning_rate=1e-4,-1"]
    elif change == "uncommitted":
        params["train"]["steps"] += 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if change in ("scratch", "launcher"):
        subprocess.run(["git", *GIT_ID, "commit", "-qam", change], check=True)
    with pytest.raises(UserError) as refused:
        grid.main([*axes, "--on", on, "--dry-run"])
    assert said in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert "would start" not in capsys.readouterr().out
