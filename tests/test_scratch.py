"""MaxText's working directory on gs:// (runtime.scratch_dir), through the real GCS protocol:
a checkpoint counts as complete only once Orbax has committed it."""

import pytest

from stages.lib import workdir
from testkit.gcs_server import CLIENT_ENV, GcsServer


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    server = GcsServer(tmp_path / "gcs")
    server.start()
    server.create_bucket("scratch-bucket")
    for key, value in {**CLIENT_ENV, "STORAGE_EMULATOR_HOST": server.url}.items():
        monkeypatch.setenv(key, value)
    yield server
    server.stop()


def test_only_committed_checkpoints_on_gcs_count_as_resume_points(gcs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    work = workdir.Workdir("gs://scratch-bucket/scratch", "train-0123456789abcdef")
    assert work.url == "gs://scratch-bucket/scratch/train-0123456789abcdef" and work.on_gcs
    # On GCS Orbax writes a step under its final name and marks it done with commit_success.txt.
    for step in (10, 20):
        work.fs.pipe(f"{work.checkpoints}/{step}/model_params/manifest.ocdbt", b"data")
        work.fs.pipe(f"{work.checkpoints}/{step}/commit_success.txt", b"done")
    work.fs.pipe(f"{work.checkpoints}/30/model_params/manifest.ocdbt", b"cut short by a preemption")
    assert work.complete_steps() == [10, 20]
    work.prune(keep=1)
    assert work.complete_steps() == [20]
    other = workdir.Workdir("gs://scratch-bucket/scratch", "train-fedcba9876543210")
    other.fs.pipe(f"{other.checkpoints}/5/commit_success.txt", b"done")
    assert work.others() == ["scratch-bucket/scratch/train-fedcba9876543210"]
    work.remove()
    assert not work.fs.exists(work.root)
