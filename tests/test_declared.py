"""dvc.yaml declares exactly what each stage reads: a declared key that does not exist would
track nothing, and a key a stage reads without declaring it would change its result without
DVC re-running it. What the stages read is recorded from the real runs of this session
(stages/lib/params.py notes every key a stage reads; tests/conftest.py collects them)."""

from pathlib import Path

import pytest
import yaml

from stages.lib.dvc_yaml import declared as declared_by
from stages.lib.params import leaf_paths
from stages.lib.workdir import IDENTIFIED_BY_INPUTS

ROOT = Path(__file__).resolve().parents[1]
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


# Read to decide whether and how a stage runs, never what it computes: runtime.* (scratch,
# caches, workers) and hardware.kind in every stage's pre-flight check (is the accelerator
# on this machine?). Stages declare what else of `hardware` they read: train and preference
# all of it, the others hardware.tpu_env (not hardware.hosts, how many processes the
# training stages run as).
HOW_TO_RUN = ("runtime", "hardware.kind")


def declared(stage: str) -> list[str]:
    return declared_by(stage, str(ROOT / "dvc.yaml"))[0]


def covered(key: str, keys: list[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in keys)


def test_every_declared_param_exists_and_none_is_a_runtime_setting():
    known = set(leaf_paths())
    for name in STAGES:
        for key in declared(name):
            assert key in known, f"stage {name} declares unknown param {key}"
            assert not key.startswith("runtime"), f"stage {name} declares {key}: runtime.* never changes a result"


@pytest.mark.slow
def test_every_param_a_stage_reads_is_declared_by_it(tiny_run, params_read_log):
    """Read after the session's pipeline runs (tiny_run at least; the LoRA, fault and remote
    runs too when they ran first)."""
    read: dict[str, set[str]] = {}
    for line in params_read_log.read_text().splitlines():
        stage, _, keys = line.partition(": ")
        read.setdefault(stage, set()).update(keys.split())
    assert set(STAGES) <= set(read), f"no record of stages {set(STAGES) - set(read)}"
    for name in STAGES:
        allowed = [*HOW_TO_RUN, *declared(name)]
        # train names its working directory by what made models/base-maxtext (the convert_in
        # params), a declared dependency of it: stages/lib/workdir.py.
        allowed += [
            k for path, maker in IDENTIFIED_BY_INPUTS.items() if path in STAGES[name]["deps"] for k in declared(maker)
        ]
        # A section read on the way to one of its keys (params["train"]["steps"]) is not a read of the section.
        undeclared = sorted(
            k for k in read[name] if not covered(k, allowed) and not any(a.startswith(k + ".") for a in allowed)
        )
        assert undeclared == [], f"stage {name} reads {undeclared} but dvc.yaml does not declare them"
