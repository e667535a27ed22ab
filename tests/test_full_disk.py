"""A MaxText process that stopped on a full disk is said so in one line that names where it
was writing and how much room is left there (stages/lib/maxtext_process.py). The disks
themselves fill in tests/test_faults.py; here, the line for an error that names no file."""

import os
import sys

import pytest

from stages.lib import maxtext_process
from stages.lib.maxtext_process import MaxTextFailed, Worker

ADVICE = "free that much, then `dvc repro` resumes"


def failure_said(command: list[str], log: str) -> str:
    """The one line the stage raises for `command` (a stand-in for MaxText) that failed."""
    with pytest.raises(MaxTextFailed) as failed:
        maxtext_process.run_workers(
            "train", "train_sft", [Worker("MaxText", command, dict(os.environ), log)], None, 0.05, None, ADVICE
        )
    return str(failed.value)


def test_an_error_that_names_no_file_is_placed_in_the_processs_output_directory(tmp_path, monkeypatch):
    """Measured: a disk that fills between two checkpoints fails MaxText's append to its
    metrics file, and Python's error names no path; the line names the run's working
    directory (its base_output_directory) instead."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scratch" / "train-0123"
    out.mkdir(parents=True)
    fail = "import sys; sys.stderr.write('OSError: [Errno 28] No space left on device\\n'); sys.exit(1)"
    command = [sys.executable, "-c", fail, f"base_output_directory={out}", "steps=12"]
    said = failure_said(command, str(tmp_path / "w.log"))
    assert "\n" not in said, said
    assert (
        said.startswith(f"train_sft ran out of disk space after 0 s writing {out} (") and "GB free there now)" in said
    )
    assert said.endswith(ADVICE), said
    # (gs:// is not this machine's disk: no place is guessed)
    assert maxtext_process.output_directory(["base_output_directory=gs://b/scratch"]) is None


# What MaxText 0.2.5 printed when the disk filled under its final checkpoint save (measured
# in test_faults.py's run; paths shortened): the error, then ~390 KB of Orbax's threads
# failing as the interpreter shut down.
OCDBT_ENOSPC = (
    'ValueError: RESOURCE_EXHAUSTED: Error writing "decoder.decoder_norm.scale.value/0" in OCDBT database at '
    'local file "{out}/sft/checkpoints/12.orbax-checkpoint-tmp/model_params.orbax-checkpoint-tmp/ocdbt.process_0/": '
    'Failed writing: "{out}/sft/checkpoints/12.orbax-checkpoint-tmp/d/39c0": Failed to write 2953216 bytes to '
    "file 23: No space left on device [os_error_code='28']\n"
)
SHUTDOWN_NOISE = (
    "Exception ignored in: <coroutine object async_serialize_from_host.<locals>.write_fragment at 0x7fe2>\n"
    "Traceback (most recent call last):\n"
    '  File "orbax/checkpoint/_src/serialization/limits.py", line 72, in release_bytes\n'
    "ImportError: sys.meta_path is None, Python is likely shutting down\n"
)


def test_a_full_disk_is_found_under_the_noise_of_a_shutdown(tmp_path, monkeypatch):
    """The error is far from the log's end: the line still says it, and names the checkpoint."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scratch" / "train-0123"
    out.mkdir(parents=True)
    log = tmp_path / "error.log"
    log.write_text(OCDBT_ENOSPC.format(out=out) + SHUTDOWN_NOISE * 2000)  # (~460 KB after it)
    fail = f"import sys; sys.stderr.write(open({str(log)!r}).read()); sys.exit(1)"
    said = failure_said([sys.executable, "-c", fail], str(tmp_path / "w.log"))
    assert said.startswith(f"train_sft ran out of disk space after 0 s writing {out}/sft/checkpoints/12."), said


def test_the_watch_reads_a_growing_log_once_and_a_line_cut_by_a_write(tmp_path):
    log, line = tmp_path / "w.log", OCDBT_ENOSPC.format(out="/d")
    log.write_text("step 1\n" + line[:150])
    watch = maxtext_process.DiskFullWatch(str(log))
    assert watch.check() == (False, None)
    with open(log, "a") as f:
        f.write(line[150:] + SHUTDOWN_NOISE)
    assert watch.check() == (
        True,
        "/d/sft/checkpoints/12.orbax-checkpoint-tmp/model_params.orbax-checkpoint-tmp/ocdbt.process_0/",
    )
    assert watch.offset == log.stat().st_size
    # A line still being written counts: a process that hangs after it writes nothing more.
    log.write_text("OSError: [Errno 28] No space left on device: '/d/metrics.jsonl'")
    assert maxtext_process.DiskFullWatch(str(log)).check() == (True, "/d/metrics.jsonl")
