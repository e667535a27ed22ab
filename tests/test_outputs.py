"""stages/lib/outputs.py: an output appears whole or not at all."""

import os

import pytest

from stages.lib import outputs


def test_staged_dir_appears_only_when_the_block_completes(tmp_path):
    out = tmp_path / "models" / "sft-hf"
    with outputs.staged_dir(str(out)) as tmp:
        (open(os.path.join(tmp, "model.safetensors"), "w")).write("weights")
        assert not out.exists()  # nothing at the output path while it is being written
    assert (out / "model.safetensors").read_text() == "weights"
    assert [p.name for p in out.parent.iterdir()] == ["sft-hf"]


def test_a_failed_block_leaves_the_old_output_and_no_staging(tmp_path):
    out = tmp_path / "sft-hf"
    out.mkdir()
    (out / "old").write_text("previous run")
    with pytest.raises(RuntimeError):
        with outputs.staged_dir(str(out)) as tmp:
            (open(os.path.join(tmp, "half"), "w")).write("half")
            raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["sft-hf"]
    assert (out / "old").read_text() == "previous run"


def test_staging_left_by_a_killed_run_is_swept_by_the_next(tmp_path):
    out = tmp_path / "sft-hf"
    stale = tmp_path / ".sft-hf.tmp-abc123"  # what SIGKILL leaves: no cleanup ran
    stale.mkdir()
    (stale / "part-00001.safetensors").write_text("partial")
    with outputs.staged_dir(str(out)) as tmp:
        (open(os.path.join(tmp, "done"), "w")).write("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft-hf"]
