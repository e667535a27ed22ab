"""A full-size dataset through the stages that read it: UltraChat 200k's 207,865 training rows.

    python -m bench.scale              # ~10 minutes on 2 cores, ~3 GB of disk

A synthetic set with UltraChat 200k train_sft's shape and size (bench/synthetic.py: 207,865
conversations, median ~1,100 tokens; the Hub is out of reach here), with one bad row in
1,000, goes through
  - the dataset stage (on_bad_row: skip): time and peak memory, against reading the file;
  - the token_lengths stage: time (it runs once per dataset and tokenizer);
  - the train stage's start, twice: the time from `dvc repro train` to MaxText starting,
    the first time (it writes the data stream) and again after a kill (a restart, as after
    a preemption), against MaxText's own start.
The model is the tiny one: the data, not the model, is measured.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import GIB, Row, env, log, new_workspace, read_all, run_alone, timed, verdict  # noqa: E402
from bench.synthetic import conversations  # noqa: E402

TRAIN_ROWS, EVAL_ROWS = 207_865, 2_000
BAD_EVERY = 1000


def write_data(root: Path) -> Path:
    data = root / "bigdata"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:
        for i, row in enumerate(conversations(TRAIN_ROWS, seed=1), start=1):
            f.write((json.dumps(row) if i % BAD_EVERY else json.dumps({"messages": row["messages"][:-1]})) + "\n")
    with open(data / "eval.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in conversations(EVAL_ROWS, seed=2))
    return data


def configure(root: Path) -> None:
    from testkit.workspace import commit, set_param

    for key, value in {
        "dataset.local_dir": "bigdata",
        "dataset.on_bad_row": "skip",
        "dataset.max_skipped_fraction": 0.01,
        "train.num_epochs": 1,
        "train.steps": 1000,
    }.items():
        set_param(root, key, value)
    commit(root, "full-size data")


def until_maxtext_starts(root: Path) -> float:
    """Seconds from `dvc repro train` to the train stage launching MaxText's trainer; then
    everything is killed, as a preemption would."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        ["dvc", "repro", "train"],
        cwd=root,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = []
    for line in proc.stdout:
        output.append(line)
        if "running maxtext.trainers.post_train.sft.train_sft" in line:
            seconds = time.perf_counter() - started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return seconds
    raise RuntimeError("dvc repro train ended before MaxText started:\n" + "".join(output[-40:]))


def bench(work: Path) -> list[Row]:
    root = new_workspace(work / "scale")
    log("scale: writing the full-size synthetic set")
    data = write_data(root)
    configure(root)
    size = (data / "train.jsonl").stat().st_size
    reading = read_all(data / "train.jsonl")
    log("scale: dataset stage")
    dataset = timed(["dvc", "repro", "dataset"], root, sample_rss=True)
    rss = max(v for k, v in dataset.peak_rss.items() if "stages.dataset" in k)
    counts = json.loads((root / "metrics" / "dataset.json").read_text())
    log("scale: token_lengths stage")
    timed(["dvc", "repro", "base_model"], root)
    lengths = timed(["dvc", "repro", "token_lengths"], root)
    timed(["dvc", "repro", "convert_in", "fit_check"], root)
    log("scale: the train stage's start, then a restart")
    first = until_maxtext_starts(root)
    restart = until_maxtext_starts(root)
    maxtext = timed([sys.executable, "-c", "import maxtext.trainers.post_train.sft.train_sft"], root).seconds
    shape = json.loads((root / "metrics" / "token_lengths.json").read_text())["train"]
    note = (
        f"{counts['train']['rows']:,} rows kept, {counts['train']['skipped']} skipped (1 in {BAD_EVERY} made bad); "
        f"{size / 1e9:.2f} GB; median {shape['median_tokens']} tokens, 90% under {shape['p90_tokens']}"
    )
    return [
        Row(
            "10. scale: dataset stage, 207,865 rows",
            f"{dataset.seconds:.0f} s, {rss / GIB:.2f} GiB peak",
            f"{reading:.1f} s to read the file",
            f"{dataset.seconds / reading:.0f}x",
            "<= 120 s, <= 2 GiB",
            verdict(dataset.seconds <= 120 and rss <= 2 * GIB),
            [note],
        ),
        Row(
            "10. scale: token_lengths stage, 207,865 rows",
            f"{lengths.seconds:.0f} s",
            f"{dataset.seconds:.0f} s (dataset)",
            f"{lengths.seconds / dataset.seconds:.1f}x",
            "once per dataset and tokenizer",
            "info",
            [f"{shape['tokens'] / 1e6:.0f}M tokens on {os.cpu_count()} cores"],
        ),
        Row(
            "10. scale: train stage's first start, until MaxText starts",
            f"{first:.1f} s",
            f"{maxtext:.1f} s (MaxText's import)",
            f"{first / maxtext:.2f}x",
            "info (writes the stream)",
            "info",
        ),
        Row(
            "10. scale: train stage's restart, until MaxText starts",
            f"{restart:.1f} s",
            f"{maxtext:.1f} s (MaxText's import)",
            f"{restart / maxtext:.2f}x",
            "< 10 s",
            verdict(restart < 10),
        ),
    ]


if __name__ == "__main__":
    run_alone("scale", bench)
