"""The benchmark suite's plumbing: what it reads from a real run, and how it records a table.
(The benchmarks themselves run with scripts/bench.sh, not here: tests never time things.)"""

import subprocess

import pytest
from test_pipeline import ALL_STAGES

from bench import common, run
from testkit.workspace import REPO, env


def test_the_benchmark_suite_starts_from_its_documented_command(tmp_path):
    """`scripts/bench.sh --list` as the README and docs/benchmarks.md give it: every benchmark
    module imports outside pytest (nothing in bench/ reads tests/) and says what it measures."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "bench.sh"), "--list"],
        cwd=tmp_path,
        env=env(PYTHONPATH=None),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert listed == list(run.BENCHMARKS), proc.stdout


@pytest.mark.slow
def test_every_stage_reports_its_time_and_the_bench_reads_it(tiny_run):
    times = common.stage_seconds(tiny_run.output)
    assert ALL_STAGES <= times.keys(), times
    # MaxText's runs inside stages are timed on their own (bench/pipeline.py subtracts the two gates).
    assert (
        "convert_out.check:stages.in_maxtext.logit_check" in times
        and "train:maxtext.trainers.post_train.sft.train_sft" in times
    )
    assert 0 < times["convert_in.check:stages.in_maxtext.logit_check"] < times["convert_in"]
    assert 0 < times["convert_out.check:stages.in_maxtext.logit_check"] < times["convert_out"]
    assert sum(times[s] for s in ALL_STAGES) < tiny_run.seconds


def test_recording_replaces_only_the_generated_table(tmp_path):
    doc = tmp_path / "benchmarks.md"
    run.record(doc, "first table")
    assert "first table" in doc.read_text()
    doc.write_text(
        "# Benchmarks\n\nWritten by hand.\n\n" + doc.read_text().split("\n\n", 1)[1] + "\nAnalysis, by hand.\n"
    )
    run.record(doc, "second table")
    text = doc.read_text()
    assert "second table" in text and "first table" not in text
    assert "Written by hand." in text and "Analysis, by hand." in text


def test_disk_use_counts_a_hard_linked_file_once(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "object").write_bytes(b"x" * 1_000_000)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "file").hardlink_to(tmp_path / "cache" / "object")
    once = common.du(tmp_path / "cache")
    assert once >= 1_000_000
    assert common.du(tmp_path / "out", tmp_path / "cache") == once
