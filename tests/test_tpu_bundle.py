"""The offline install for a TPU VM (tools/tpu_bundle.py), on a CPU as far as a CPU goes: a
bundle built here installs with no network into a fresh copy of the project
(`scripts/setup-tpu.sh --offline`, on the system's own Python: not 3.12, as on a TPU VM), and
a stage runs from it; a damaged or missing piece is refused before anything is unpacked.

The bundle here carries the packages `python -m stages.dataset` loads, not the whole TPU list
(650 MB of wheels, libtpu's among them): the code path is the same. The whole bundle was
installed on a TPU v5e chip's machine, and the train stage ran from it (docs/benchmarks.md,
"On a TPU chip"); tests/test_tpu.py runs there from it too.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.workspace import REPO, copy_project
from tools import tpu_bundle

# What `python -m stages.dataset` imports (python -X importtime), as distributions.
DATASET_STAGE = """annotated-types pydantic pydantic-core typing-extensions typing-inspection pyyaml numpy
huggingface-hub httpx2 httpcore2 h11 anyio idna certifi filelock fsspec packaging tqdm""".split()
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def offline(*command, cwd) -> subprocess.CompletedProcess:
    """A command in a network namespace of its own (no interface but a down loopback), with a
    bare environment: nothing of this test's Python leaks in."""
    return subprocess.run(
        ["unshare", "-n", *map(str, command)],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
    )


def test_the_offline_list_is_pinned_by_the_tpu_lock():
    pins = tpu_bundle.offline_pins()
    names = {p.split("==")[0] for p in pins}
    assert {"maxtext", "google-tunix", "jax", "jaxlib", "libtpu", "dvc", "xprof", "sympy"} <= names
    assert not names & {"torch", "torchvision", "tensorflow", "vllm", "lm-eval"}, "the CPU machine's, not the VM's"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("unshare") or SYSTEM_PYTHON is None, reason="needs unshare and /usr/bin/python3")
def test_a_bundle_installs_with_no_network_and_a_stage_runs_from_it(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(DATASET_STAGE) + "\n")
    bundle = tmp_path / "bundle"
    built = subprocess.run(
        [sys.executable, "-m", "tools.tpu_bundle", "build", "--out", bundle, "--piece-mb", "8", "--names", names],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert len(manifest["pieces"]) > 1 and all(p["bytes"] <= 8e6 for p in manifest["pieces"])
    assert manifest["python"].startswith("3.12.") and len(manifest["wheels"]) == len(DATASET_STAGE) + 1  # + uv

    project = copy_project(tmp_path / "vm")  # a fresh copy: no .venv
    installer = ["bash", "scripts/setup-tpu.sh", "--offline", bundle]  # python3 there: the system's 3.11

    # A piece damaged in transit, then one missing: refused in one line, nothing installed.
    damaged = tmp_path / "damaged"
    shutil.copytree(bundle, damaged)
    piece = damaged / manifest["pieces"][1]["name"]
    data = bytearray(piece.read_bytes())
    data[1000] ^= 0x01
    piece.write_bytes(bytes(data))
    refused = offline(*installer[:-1], damaged, cwd=project)
    assert refused.returncode == 1 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"{piece}: its SHA-256 differs from the manifest's" in refused.stderr
    piece.unlink()
    refused = offline(*installer[:-1], damaged, cwd=project)
    assert refused.returncode == 1 and f"{piece}: missing" in refused.stderr, refused.stderr
    assert not (project / ".venv").exists() and not (project / ".python").exists()

    done = offline(*installer, cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    python = project / ".venv" / "bin" / "python"
    assert (project / ".venv" / ".tpu-bundle.sha256").read_text().strip() == manifest["archive_sha256"]
    # The interpreter is the bundle's, relocated: its libraries found from where it now lies.
    version = offline(
        python, "-c", "import sys, ssl, sqlite3, lzma; print(sys.version_info[:2], sys.prefix)", cwd=project
    )
    assert version.returncode == 0 and "(3, 12)" in version.stdout and str(project / ".venv") in version.stdout, (
        version.stderr
    )
    stage = offline(python, "-m", "stages.dataset", cwd=project)
    assert stage.returncode == 0, stage.stdout + stage.stderr
    assert (project / "data" / "chat" / "train.jsonl").stat().st_size > 0
    # Installing the same bundle again does nothing.
    again = offline(*installer, cwd=project)
    assert again.returncode == 0 and "already holds this bundle" in again.stdout


def test_install_refuses_a_bundle_of_another_format(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99, "pieces": []}))
    with pytest.raises(tpu_bundle.BundleError, match="bundle format 99"):
        tpu_bundle.install(str(tmp_path), str(tmp_path))
    assert not Path(tmp_path, ".venv").exists()
    assert os.listdir(tmp_path) == ["manifest.json"]
