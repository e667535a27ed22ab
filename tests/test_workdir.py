"""The training working directory (stages/lib/workdir.py): named by exactly what the train
stage trains, local or on gs://."""

from pathlib import Path

import pytest
import yaml

from stages.lib import dvc_yaml, workdir
from tools.recipe import params_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def params() -> dict:
    return yaml.safe_load(params_text("tiny"))


def test_the_train_stage_declares_what_the_digest_covers():
    keys, deps = dvc_yaml.declared("train", str(ROOT / "dvc.yaml"))
    assert {"model", "train", "hardware"} <= set(keys) and not any(k.startswith("runtime") for k in keys)
    data = workdir.data_dependencies(deps)
    assert {"models/base-hf", "models/base-maxtext", "data/chat"} <= set(data)
    assert not [d for d in data if d.endswith(".py")]  # code is not what is trained


def test_the_digest_changes_with_what_is_trained_and_nothing_else(params):
    keys, _ = dvc_yaml.declared("train", str(ROOT / "dvc.yaml"))
    inputs = {"data/chat": "a.dir", "models/base-maxtext": "b.dir"}
    trainer = {"maxtext": "0.2.5", "google-tunix": "0.1.7"}

    def digest(section=None, key=None, value=None, inputs=inputs, trainer=trainer):
        p = yaml.safe_load(yaml.safe_dump(params))
        if section:
            p[section][key] = value
        return workdir.digest(workdir.tracked_values(p, keys), inputs, trainer)

    same = digest()
    assert len(same) == 16 and digest() == same
    assert digest("runtime", "keep_checkpoints", 5) == same  # how to run, not what
    assert digest("runtime", "scratch_dir", "gs://bucket/scratch") == same  # where, not what
    assert digest("convert_out", "shard_size_mb", 1) == same  # read after training
    # How much memory it takes, not what it computes: after an out-of-memory kill, remat full resumes the run.
    assert digest("train", "remat_policy", "minimal" if params["train"]["remat_policy"] == "full" else "full") == same
    assert digest("train", "per_device_batch_size", 7) != same  # other batches: another training
    assert digest("train", "learning_rate", 1.0) != same
    assert digest("train", "seed", 7) != same
    assert digest("model", "scan_layers", not params["model"]["scan_layers"]) != same
    assert digest(inputs={**inputs, "data/chat": "c.dir"}) != same  # other data
    assert digest(trainer={**trainer, "maxtext": "0.2.6"}) != same  # another trainer


def test_a_local_and_a_gcs_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = workdir.Workdir(".scratch", "train-0123")
    assert local.url == local.local == str(tmp_path / ".scratch" / "train-0123") and not local.on_gcs
    assert local.metrics_file == str(tmp_path / ".scratch" / "train-0123" / "metrics.jsonl")
    remote = workdir.Workdir("gs://bucket/scratch/", "train-0123")
    assert remote.url == "gs://bucket/scratch/train-0123" and remote.on_gcs
    assert remote.local == str(tmp_path / ".scratch" / "train-0123")  # what must stay on this machine


def test_only_renamed_checkpoints_count_locally_and_pruning_keeps_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    work = workdir.Workdir(".scratch", "train-0123")
    for name in ("1", "10", "20", "30.orbax-checkpoint-tmp-5"):
        Path(work.checkpoints, name).mkdir(parents=True)
    assert work.complete_steps() == [1, 10, 20]  # 30 was being written when the run died
    work.prune(keep=2)
    assert work.complete_steps() == [10, 20]
    other = workdir.Workdir(".scratch", "train-4567")
    Path(other.local).mkdir(parents=True)
    assert work.others() == [other.url]
    work.remove()
    assert not Path(work.url).exists() and Path(other.url).exists()


def test_a_second_trainer_on_the_same_directory_is_refused(tmp_path, monkeypatch):
    from stages.shared.errors import StageFailed

    monkeypatch.chdir(tmp_path)
    first = workdir.Workdir(".scratch", "train-0123")
    with first.lock():
        with pytest.raises(StageFailed, match="another training run is using"):
            workdir.Workdir(".scratch", "train-0123").lock()
    workdir.Workdir(".scratch", "train-0123").lock().close()  # free again once the first is done
