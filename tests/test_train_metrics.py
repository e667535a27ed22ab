"""MaxText's per-step metrics lines (stages/lib/train_metrics.py): read across a kill and a
resume, summarised, and shown as progress."""

import csv
import json

import pytest

from stages.lib import train_metrics


def step(n, loss, tflops=1.0, seconds=0.5):
    return {
        "step": n,
        "learning/loss": loss,
        "learning/current_learning_rate": 1e-3,
        "learning/grad_norm": 2.0,
        "perf/step_time_seconds": seconds,
        "perf/per_device_tokens_per_sec": 100.0 * n,
        "perf/per_device_tflops_per_sec": tflops,
    }


def test_a_resumed_run_replaces_the_killed_runs_steps_and_a_cut_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    killed = [step(1, 9.0), step(2, 8.0), step(3, 7.0)]
    resumed = [step(3, 6.5), step(4, 6.0)]
    evals = [{"step": 0, "eval/avg_loss": 9.5, "eval/avg_perplexity": 1e4}]
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in killed + evals)
        + '{"step": 4, "learning/lo'  # cut by SIGKILL
        + "\n"
        + "".join(json.dumps(r) + "\n" for r in resumed)
    )
    got = train_metrics.steps(str(path))
    assert [s["step"] for s in got] == [1, 2, 3, 4]
    assert [s["learning/loss"] for s in got] == [9.0, 8.0, 6.5, 6.0]
    assert train_metrics.evals(str(path), 20) == evals
    start = len(json.dumps(killed[0])) + 1
    assert [s["step"] for s in train_metrics.steps(str(path), start)] == [2, 3, 4]


def test_only_scheduled_evaluations_count(tmp_path):
    # A run resumed at step 10 evaluates there too (Tunix evaluates when it starts); an
    # uninterrupted run with eval_interval 20 would not, so that one is left out.
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "eval/avg_loss": 10.0 - s / 10} for s in (0, 10, 20, 40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["step"] for r in train_metrics.evals(str(path), 20)] == [0, 20, 40]
    assert train_metrics.evals(str(path), 0) == []


def test_progress_leaves_the_compiling_step_out_of_the_rate():
    done = [step(1, 9.0, seconds=30.0), step(2, 8.0, seconds=1.0), step(3, 7.0, seconds=1.0)]
    assert train_metrics.progress_line(done, 63) == "step 3/63  loss 7.0000  lr 1.00e-03  1.00 s/step  ETA 1.0 min"
    assert "30.00 s/step" in train_metrics.progress_line(done[:1], 63)


def test_the_reporter_says_it_is_starting_until_a_step_is_logged(tmp_path):
    path = tmp_path / "m.jsonl"
    calls = []
    poll = train_metrics.reporter(str(path), 10, 0, on_poll=lambda: calls.append(1))
    assert poll().startswith("starting: loading the model and compiling the train step")
    path.write_text(json.dumps(step(1, 9.0)) + "\n")
    assert poll().startswith("step 1/10  loss 9.0000")
    assert len(calls) == 2


def test_mfu_is_maxtexts_tflops_over_the_chips_peak():
    done = [step(1, 1.0, tflops=5.0), step(2, 1.0, tflops=459.0), step(3, 1.0, tflops=459.0)]  # step 1 compiles
    assert train_metrics.summary(done, [], "v6e-8")["mfu"] == pytest.approx(
        459.0 / 918
    )  # v6e: 918 bf16 TFLOP/s per chip
    assert train_metrics.summary(done, [], "cpu")["mfu"] is None


def tsv(path) -> list[tuple[int, float]]:
    rows = list(csv.DictReader(open(path), delimiter="\t"))
    return [(int(r["step"]), float(r[path.stem])) for r in rows]


def test_the_curve_logs_each_step_once_in_order_and_the_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    curve = train_metrics.Curve()
    evals = [{"step": 0, "eval/avg_loss": 9.5, "eval/avg_perplexity": 1e4}]
    curve.add([step(1, 9.0), step(2, 8.0), step(3, 7.0)], evals, up_to=2)  # a killed run's lines, up to its checkpoint
    plots = tmp_path / train_metrics.PLOTS
    assert tsv(plots / "train" / "loss.tsv") == [(1, 9.0), (2, 8.0)]  # written as they come, not at the end
    curve.add([step(3, 6.5), step(4, 6.0)], [*evals, {"step": 4, "eval/avg_loss": 6.2, "eval/avg_perplexity": 492.7}])
    curve.add([step(4, 6.0)], [])  # seen again at the next poll: not logged twice
    assert tsv(plots / "train" / "loss.tsv") == [(1, 9.0), (2, 8.0), (3, 6.5), (4, 6.0)]
    assert tsv(plots / "eval" / "loss.tsv") == [(0, 9.5), (4, 6.2)]
    assert [s for s, _ in tsv(plots / "train" / "learning_rate.tsv")] == [1, 2, 3, 4]
    done = [step(1, 9.0), step(2, 8.0), step(3, 6.5), step(4, 6.0)]
    curve.end({**train_metrics.summary(done, evals, "cpu"), "conversations_truncated": 3})
    m = json.loads((tmp_path / train_metrics.SUMMARY).read_text())
    assert m["step"] == 4 and m["train"]["loss"] == 6.0 and m["eval"]["loss"] == 6.2
    assert (m["run"]["steps"], m["run"]["first_step_loss"], m["run"]["final_loss"]) == (4, 9.0, 6.0)
    assert m["run"]["conversations_truncated"] == 3 and m["run"]["mfu"] is None


def test_a_run_whose_lines_were_lost_still_has_a_summary():
    assert train_metrics.summary([], [], "v6e-8")["steps"] is None


def test_evaluate_reads_back_the_evaluations_the_curve_logged(tmp_path, monkeypatch):
    """What stages/evaluate.py takes instead of its own passes: each logged evaluation with its
    loss, perplexity and target tokens; an evaluation missing one (a curve of an older run)
    is none."""
    from stages import evaluate
    from testkit.sections import Sections

    monkeypatch.chdir(tmp_path)
    curve = train_metrics.Curve()
    row = {"eval/avg_loss": 9.5, "eval/avg_perplexity": 1.3e4, "eval/total_weights": 1010.0}
    curve.add([step(1, 9.0), step(2, 8.0)], [{"step": 0, **row}, {"step": 2, **row, "eval/avg_loss": 6.25}])
    assert train_metrics.logged_evals() == {
        0: {"loss": 9.5, "perplexity": 1.3e4, "target_tokens": 1010.0},
        2: {"loss": 6.25, "perplexity": 1.3e4, "target_tokens": 1010.0},
    }
    params = Sections({"train": {"steps": 2, "eval_interval": 2, "chat_rendering": "whole"}})
    found = evaluate.from_training(params)
    assert found["base"]["loss"] == 9.5 and found["fine_tuned"]["loss"] == 6.25
    assert found["fine_tuned"]["target_tokens"] == 1010 and found["fine_tuned"]["perplexity"] == pytest.approx(
        518.0, 1e-3
    )
    # training did not evaluate at its last step, or at all: evaluate computes them itself
    for change in ({"steps": 3}, {"eval_interval": 0}, {"chat_rendering": "per_round"}):
        assert evaluate.from_training(Sections({"train": {**params["train"], **change}})) is None
    (tmp_path / train_metrics.PLOTS / "eval" / "target_tokens.tsv").unlink()
    assert train_metrics.logged_evals() == {} and evaluate.from_training(params) is None
