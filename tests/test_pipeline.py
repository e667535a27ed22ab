"""The pipeline under DVC: every stage runs once, nothing re-runs without cause, and the
metrics read at a glance. (A changed param re-runs exactly the stages that read it: a
train.* change in tests/test_experiments.py, a convert_out.* change in tests/test_remote.py,
on the experiment that machine shares.)"""

import json

import pytest
import yaml

from stages.lib.dvc_yaml import stage_names
from testkit.workspace import REPO, sh, stages_run

ALL_STAGES = set(stage_names(str(REPO / "dvc.yaml")))  # every stage dvc.yaml has


@pytest.mark.slow
def test_repro_runs_every_stage_once_then_nothing(tiny_run):
    assert set(stages_run(tiny_run.output)) == ALL_STAGES
    assert len(stages_run(tiny_run.output)) == len(ALL_STAGES)
    again = sh(["dvc", "repro"], tiny_run.path)
    assert stages_run(again.stdout) == []
    assert "Data and pipelines are up to date" in again.stdout
    assert json.loads(sh(["dvc", "status", "--json"], tiny_run.path).stdout) == {}


@pytest.mark.slow
def test_metrics_read_at_a_glance(tiny_run):
    # Every metric file groups its figures under the same few names, so `dvc metrics show`
    # has one column per figure (train.rows from dataset.json and token_lengths.json alike).
    shown = json.loads(sh(["dvc", "metrics", "show", "--json"], tiny_run.path).stdout)
    files = next(iter(shown.values()))["data"]
    groups = {path: set(found["data"]) for path, found in files.items()}
    assert groups == {
        "metrics/dataset.json": {"train", "eval"},
        "metrics/constraints.json": {"constraints"},  # (share 0: none made, its counts zero)
        "metrics/token_lengths.json": {"train", "eval"},
        "metrics/fit_check.json": {"fit"},
        "metrics/convert_check.json": {"conversion"},  # (as export_check.json)
        "dvclive/metrics.json": {"train", "run", "step"},
        "metrics/export_check.json": {"export"},  # its per-prompt lists are not metrics columns
        "metrics/gguf_check.json": {"gguf"},  # per type under it
        "metrics/eval.json": {"eval"},
        "metrics/benchmark.json": {"benchmark"},
        "metrics/self_pairs.json": {"self_pairs"},  # (off: {"enabled": false} under it)
        "metrics/preference_data.json": {"preference_data"},  # (off: {"enabled": false} under it)
        "dvclive-preference/metrics.json": {"run"},  # (off: {"enabled": false}; on: DVCLive's, as train's)
    }, groups
    assert (
        files["metrics/dataset.json"]["data"]["train"]["rows"]
        == files["metrics/token_lengths.json"]["data"]["train"]["rows"]
    )
    # ... and the demo ends with a summary of them.
    summary = sh(["python", "-m", "tools.summary"], tiny_run.path).stdout.splitlines()
    heldout = files["metrics/eval.json"]["data"]["eval"]
    assert [line.split()[0] for line in summary] == [
        "data",
        "conversion",
        "training",
        "held-out",
        "export",
        "gguf",  # one line per gguf.types: the tiny recipe's f16 and q8_0
        "gguf",
        "benchmarks",
        "time",
    ]
    assert summary[1].startswith("conversion  passed: max KL")
    assert f"loss {heldout['base_loss']:.3f} (base) -> {heldout['fine_tuned_loss']:.3f} (fine-tuned)" in summary[3]
    assert summary[4].startswith("export      passed: max KL")
    f16_mb = (tiny_run.path / "models" / "gguf" / "model-F16.gguf").stat().st_size / 1e6
    assert summary[5].startswith("gguf f16    passed: max KL") and summary[5].endswith(
        f"; model-F16.gguf, {f16_mb:,.1f} MB"
    )
    assert summary[6].startswith("gguf q8_0   passed: max KL") and "; model-Q8_0.gguf, " in summary[6]
    times = json.loads((tiny_run.path / "logs" / "stage_times.json").read_text())
    assert set(times) == ALL_STAGES and all(t >= 0 for t in times.values())  # CPU fit_check: ~0 s
    assert summary[7].startswith("benchmarks  chat_arithmetic ")
    assert all(stage in summary[8] for stage in ALL_STAGES)


def _bytes(path, pattern: str = "**/*") -> int:
    return sum(f.stat().st_size for f in path.glob(pattern) if f.is_file())


@pytest.mark.slow
def test_the_cost_preview_matches_the_bytes_the_run_wrote(tiny_run):
    """tools.plan's byte figures against the tiny run's files. Safetensors files hold exactly
    the weights: within 1%. Orbax compresses its chunks (zstd), so the plan's uncompressed
    figure bounds them from above: here they come out 8-22% smaller; 0.7x is the floor."""
    from stages.lib.params import validate
    from tools import plan

    params = validate(yaml.safe_load((tiny_run.path / "params.yaml").read_text()))
    models = tiny_run.path / "models"
    dims = plan.dimensions(params, str(models / "base-hf"))
    stages = {s["stage"]: s for s in plan.plan(params, dims)["stages"]}
    base = stages["base_model"]["written"]["boot disk"]
    assert abs(_bytes(models / "base-hf", "*.safetensors") / base - 1) < 0.01
    assert abs(_bytes(models / "sft-hf", "*.safetensors") / base - 1) < 0.01  # the export: bf16, as the base
    converted = stages["convert_in"]["written"]["boot disk"]
    final = stages["train"]["trained_params"]
    for path, planned in ((models / "base-maxtext", converted), (models / "sft-maxtext" / "params", final)):
        assert 0.7 < _bytes(path) / planned < 1.01, (path, _bytes(path), planned)


@pytest.mark.slow
def test_a_user_chats_with_both_models_side_by_side(tiny_run):
    """`python -m tools.chat --compare` on the run's two models, two messages from stdin: each
    model answers each in turn, streamed, the second in the context of the first exchange; each
    answer is the model's greedy answer to that conversation (the benchmark's own function),
    its end-of-turn marker cut."""
    import re
    import subprocess
    import sys

    from stages.lib import answers
    from stages.shared import families
    from testkit.workspace import env

    proc = subprocess.run(
        [sys.executable, "-m", "tools.chat", "--compare", "--max-new-tokens", "8"],
        cwd=tiny_run.path,
        env=env(),
        input="What is 17 plus 25?\nAnd times two?\n",
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    parts = re.split(r"^(fine-tuned|base)> ", proc.stdout, flags=re.M)[1:]
    said = list(zip(parts[::2], (text.strip() for text in parts[1::2]), strict=True))
    assert [who for who, _ in said] == ["fine-tuned", "base", "fine-tuned", "base"], proc.stdout
    for who, model_dir in (("fine-tuned", "sft-hf"), ("base", "base-hf")):
        first, second = (text for name, text in said if name == who)
        path = str(tiny_run.path / "models" / model_dir)
        model, tokenizer = families.language_model(path, "gemma3-4b"), answers.left_padding_tokenizer(path)
        conversation = [
            {"role": "user", "content": "What is 17 plus 25?"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "And times two?"},
        ]
        for shown, asked in ((first, conversation[:1]), (second, conversation)):
            (expected,) = answers.greedy_answers(model, tokenizer, [asked], 8, "<end_of_turn>")
            assert shown == expected.removesuffix(f" {answers.UNFINISHED}")
