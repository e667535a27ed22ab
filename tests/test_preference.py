"""Preference tuning after SFT (stages/preference_data.py, stages/preference.py): the pair
checks, the params it refuses, and MaxText's train_dpo run for real on the tiny model:
off by default with nothing after it re-run, on re-running only itself and what follows,
the held-out pairs preferred more by the tuned model than by the SFT model, the export and
evaluation of the tuned model, and each host's pairs after a resume. A killed run resumed bit
for bit: tests/test_multihost.py (a job of two processes, one worker killed)."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from stages.in_maxtext.heldout import preference_scores
from stages.lib import chat, preference_pairs
from stages.lib.params import validate
from stages.shared.errors import UserError
from testkit.workspace import (
    REPO,
    clone_workspace,
    commit,
    dry_run_args,
    set_key,
    set_param,
    sh,
    stages_run,
    with_real_4b_config,
)

USER = {"role": "user", "content": "What is 2 plus 2?"}


def row(chosen="4.", rejected="5.", **extra):
    return {
        "chosen": [USER, {"role": "assistant", "content": chosen}],
        "rejected": [USER, {"role": "assistant", "content": rejected}],
        **extra,
    }


def test_a_messages_pair_is_its_conversation_and_two_answers():
    pair, bad = preference_pairs.parser("messages")(row(prompt="What is 2 plus 2?"))
    assert bad is None
    assert pair == {"conversation": [USER], "chosen": "4.", "rejected": "5."}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"rejected": row()["rejected"]}, "no 'chosen' column"),
        (row(chosen=""), "chosen: messages[1].content: must be a non-empty string"),
        ({**row(), "rejected": []}, "'rejected' must be a non-empty list"),
        (row(rejected=" 4. "), "give the same answer"),
        (
            {**row(), "rejected": [{"role": "user", "content": "Other?"}, {"role": "assistant", "content": "5."}]},
            "differ before their last message",
        ),
        (row(prompt="What is 3 plus 3?"), "'prompt' differs from the conversation's last user message"),
        (
            {**row(), "chosen": [{"role": "assistant", "content": "4."}, USER]},
            "chosen: messages[0].role: expected user",
        ),
        ("a string", "expected an object with 'chosen' and 'rejected', got str"),
    ],
)
def test_bad_messages_pairs_say_what_is_wrong(value, problem):
    pair, bad = preference_pairs.parser("messages")(value)
    assert pair is None and problem in bad


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"chosen": "Human: hi\nAssistant: hello", "rejected": "Human: hi\nAssistant: hello"}, "the same text"),
        ({"chosen": "Hello there", "rejected": "Goodbye"}, "share no prompt"),
        ({"chosen": "Human: hi\nAssistant: hello", "rejected": "Human: hi\nAssistant: hello!"}, "cut short"),
        ({"chosen": "Human: hi\nA: yes", "rejected": "Human: hi\nA: no", "prompt": "Human: yo"}, "'prompt' is not"),
        ({"chosen": "", "rejected": "x"}, "'chosen' must be a non-empty string"),
    ],
)
def test_bad_text_pairs_say_what_is_wrong(value, problem):
    pair, bad = preference_pairs.parser("text")(value)
    assert pair is None and problem in bad


def test_a_text_pair_is_read_as_is():
    value = {"chosen": "Human: hi\nAssistant: hello", "rejected": "Human: hi\nAssistant: go away"}
    assert preference_pairs.parser("text")(value) == (value, None)


def test_bad_pairs_stop_or_are_skipped_and_listed_as_the_chat_data_are():
    rows = [(1, row(), None), (2, row(rejected="4."), None), (3, None, "not valid JSON (x at column 1)")]
    stop = chat.Selection("pairs.jsonl", None, parse=preference_pairs.parser("messages"), section="preference.data")
    with pytest.raises(UserError, match=r"^pairs.jsonl, row 2: chosen and rejected give the same answer"):
        list(stop.rows(rows))
    skip = chat.Selection(
        "pairs.jsonl", None, "skip", 0.7, parse=preference_pairs.parser("messages"), section="preference.data"
    )
    assert len(list(skip.rows(rows))) == 1
    assert [s["row"] for s in skip.skipped] == [2, 3]
    too_many = chat.Selection(
        "pairs.jsonl", None, "skip", 0.5, parse=preference_pairs.parser("messages"), section="preference.data"
    )
    with pytest.raises(UserError, match=r"more than preference.data.max_skipped_fraction=0.5"):
        list(too_many.rows(rows))


def test_a_pair_renders_as_train_dpo_reads_it_one_bos_and_the_answers_after_the_shared_prompt(tiny_base):
    from stages.preference_data import tokenizer_as_maxtext

    tokenizer = tokenizer_as_maxtext(str(tiny_base))
    pair, _ = preference_pairs.parser("messages")(row(chosen="Four.", rejected="It is five."))
    texts = preference_pairs.render(pair, tokenizer)
    chosen, rejected = (tokenizer(texts[side])["input_ids"] for side in ("chosen", "rejected"))
    assert chosen.count(tokenizer.bos_token_id) == 1 and chosen[0] == tokenizer.bos_token_id
    assert chosen[-1] == tokenizer.eos_token_id
    prompt, a, b = preference_pairs.split_lengths(chosen, rejected)
    assert tokenizer.decode(chosen[:prompt]).endswith("model\n")  # the answers start after the turn marker
    assert tokenizer.decode(chosen[prompt:]).startswith("Four.") and a > 0 and b > a


def params_of(recipe: str = "tiny-dpo") -> dict:
    from testkit.sections import Sections
    from tools.recipe import params_text

    return Sections(yaml.safe_load(params_text(recipe)))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.lora.enabled", True, "preference.enabled: MaxText's preference trainer (train_dpo) has no LoRA path"),
        ("preference.max_prompt_length", 128, "preference.max_prompt_length: 128 leaves no room for the answers"),
        ("preference.data.revision", None, None),  # local data: no revision needed
    ],
)
def test_preference_settings_are_refused_in_one_line(key, value, message, monkeypatch):
    monkeypatch.chdir(REPO)
    params = params_of()
    set_key(params, key, value)
    if message is None:
        validate(params)
        return
    with pytest.raises(UserError, match="^" + re.escape(f"params.yaml: {message}")):
        validate(params)


def test_a_hub_source_needs_its_revision_and_off_needs_nothing(monkeypatch):
    monkeypatch.chdir(REPO)
    params = params_of("gemma3-4b-v6e-8-dpo")
    set_key(params, "preference.data.revision", None)
    with pytest.raises(UserError, match="preference.data.revision: must be set when preference.data.source is hub"):
        validate(params)
    params = params_of("tiny")  # off: its settings are still checked, but nothing is required of them
    set_key(params, "train.lora.enabled", True)
    validate(params)


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_resumed_run_reads_each_hosts_pairs_after_those_its_steps_used(hosts, tmp_path, monkeypatch):
    """The pairs' streams (stages/preference.py): every pair once an epoch; a job's hosts
    interleaved are the one-host order (each step, the same pairs); resumed at step 3, each
    host's stream continues after the 3 x pairs_per_step its steps took."""
    from stages import preference
    from stages.lib import workdir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "preference").mkdir(parents=True)
    pairs = [json.dumps({"chosen": f"c{i}", "rejected": f"r{i}"}) for i in range(20)]
    (tmp_path / "data" / "preference" / "train.jsonl").write_text("\n".join(pairs) + "\n")
    p = params_of()
    p["hardware"]["hosts"] = hosts
    p["preference"].update(per_device_batch_size=2, gradient_accumulation_steps=1, num_epochs=1)

    def streams(hosts_now: int, step: int) -> list[list[str]]:
        p["hardware"]["hosts"] = hosts_now
        work = workdir.Workdir(str(tmp_path / f"scratch-{hosts_now}"), "preference-0", "preference", {"x": 1})
        return [Path(f).read_text().splitlines() for f in preference.streams_from(p, work, step)]

    one_host = streams(1, 0)[0]
    full, resumed = streams(hosts, 0), streams(hosts, 3)
    assert sorted(one_host) == sorted(pairs) and sorted(sum(full, [])) == sorted(pairs)
    assert [pair for step in zip(*full, strict=True) for pair in step] == one_host  # the same order, dealt out
    assert preference.pairs_per_step(p) == 2
    assert resumed == [stream[3 * 2 :] for stream in full]


def test_the_rewards_are_tunix_s_against_the_reference_and_the_preference_the_models_own():
    logps = {"sft": ([-10.0, -3.0], [-5.0, -4.0]), "tuned": ([-8.0, -3.5], [-7.0, -4.0])}
    scores = preference_scores(logps, "sft", "dpo", beta=0.5)
    assert scores["sft"]["reward_accuracy"] == 0.0 and scores["sft"]["reward_margin"] == 0.0
    # tuned vs sft: chosen +2, rejected -2 on the first pair (reward 0.5 * 4); chosen -0.5 on the second
    assert scores["tuned"]["reward_margin"] == pytest.approx((0.5 * 4 + 0.5 * -0.5) / 2)
    assert scores["tuned"]["reward_accuracy"] == 0.5
    assert scores["sft"]["preference_accuracy"] == 0.5 and scores["tuned"]["preference_accuracy"] == 0.5
    assert scores["tuned"]["logp_margin"] == pytest.approx(((-8 + 7) + (-3.5 + 4)) / 2)
    orpo = preference_scores(logps, "sft", "orpo", beta=0.1)  # no reference: the weight x the log-probability
    assert orpo["tuned"]["reward_margin"] == pytest.approx(0.1 * orpo["tuned"]["logp_margin"])


@pytest.mark.slow
def test_the_4b_dpo_recipe_passes_maxtexts_validation(workspace):
    root = with_real_4b_config(workspace("dry-run-dpo", recipe="gemma3-4b-v6e-8-dpo"))
    proc = sh([sys.executable, "-m", "stages.preference", "--dry-run"], root, timeout=300)
    args = dry_run_args(proc.stdout)
    assert args[args.index("--") + 1].endswith("post_train/dpo.yml")
    for value in (
        "dpo.algo=dpo",
        "dpo.dpo_beta=0.01",
        "dpo.max_prompt_length=512",
        "max_target_length=1024",
        "learning_rate=5e-07",
        "per_device_batch_size=2",
        "gradient_accumulation_steps=8",
        "steps=477",
        "train_data_columns=['chosen','rejected']",
    ):
        assert value in args, f"{value} not in the preference stage's MaxText command"
    assert any(a.startswith("load_parameters_path=") and a.endswith("models/sft-maxtext/params") for a in args)
    assert "MaxText accepted the configuration for maxtext.trainers.post_train.dpo.train_dpo" in proc.stdout


# --- the tiny model through train_dpo ---------------------------------------------------------

# (self_pairs, off, writes its note again: preference.enabled is one of its params)
AFTER_SFT = ["preference_data", "self_pairs", "preference", "convert_out", "export_gguf", "evaluate", "benchmark"]


def lock(root: Path) -> dict:
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


@pytest.fixture(scope="module")
def preference_run(tiny_run, tmp_path_factory):
    """A clone of tiny_run: first a preference param changed while preference tuning is off
    (`off`: that dvc repro's output), then turned on (`on`)."""
    root = clone_workspace(tiny_run, tmp_path_factory.mktemp("preference"))
    set_param(root, "preference.beta", 0.5)
    set_param(root, "preference.data.max_train_rows", 100)
    off = sh(["dvc", "repro"], root).stdout
    commit(root, "preference settings changed, still off")
    set_param(root, "preference.beta", 0.1)
    set_param(root, "preference.data.max_train_rows", None)
    set_param(root, "preference.enabled", True)
    set_param(root, "gguf.types", [])  # (the suite's time: tiny_run's GGUF is checked in tests/test_gguf_export.py)
    # (And the benchmark on 2 items a task and one prompt: it runs on the tuned export, its scores are not tested here.)
    set_param(root, "benchmark.limit", 2)
    set_param(root, "benchmark.prompts", ["What is 17 plus 25?"])
    on = sh(["dvc", "repro"], root).stdout
    commit(root, "preference tuning on")
    return type("Run", (), {"root": root, "off": off, "on": on, "tiny": tiny_run.path})


@pytest.mark.slow
def test_off_its_settings_rerun_nothing_after_it(preference_run, tiny_run):
    assert set(stages_run(preference_run.off)) == {"preference_data", "preference"}
    before = lock(tiny_run.path)
    # What they wrote is the same note, so DVC found everything after them up to date.
    for stage in ("preference_data", "preference"):
        assert (
            before[stage]["outs"]
            == yaml.safe_load(sh(["git", "show", "HEAD~1:dvc.lock"], preference_run.root).stdout)["stages"][stage][
                "outs"
            ]
        )


@pytest.mark.slow
def test_on_it_reruns_itself_and_what_follows_and_exports_the_tuned_model(preference_run):
    # preference_data and self_pairs may be restored from DVC's run-cache instead: the same
    # outputs, made by another test's run of them (tests/test_multihost.py), are in the shared cache.
    ran = set(stages_run(preference_run.on))
    restorable = {"preference_data", "self_pairs"}
    assert ran - restorable == set(AFTER_SFT) - restorable, preference_run.on[-3000:]
    for stage in restorable:
        assert stage in ran or f"Stage '{stage}' is cached - skipping run" in preference_run.on, stage
    root = preference_run.root
    assert (root / "models" / "preference-maxtext" / "params").is_dir()
    assert json.loads((root / "models" / "preference-maxtext" / "preference.json").read_text())["algorithm"] == "dpo"
    # The export is the preference-tuned model, checked against MaxText on those parameters.
    assert json.loads((root / "metrics" / "export_check.json").read_text())["export"]["passed"]
    ours, sft = lock(root)["convert_out"]["outs"][0]["md5"], lock(preference_run.tiny)["convert_out"]["outs"][0]["md5"]
    assert ours != sft
    assert "preference: step 16/16" in preference_run.on


@pytest.mark.slow
def test_the_tuned_model_prefers_the_held_out_chosen_answers_more_than_the_sft_model(preference_run):
    e = json.loads((preference_run.root / "metrics" / "eval.json").read_text())["eval"]
    assert e["pairs"] == 64
    # Tunix's reward (beta x log-ratio to the SFT model): the tuned model's chosen answers gain.
    assert e["reward_accuracy"] >= 0.9 and e["reward_margin"] > 0
    # The model's own preference moves towards the chosen side on pairs it never saw.
    assert e["preference_tuned_logp_margin"] > e["sft_logp_margin"] + 5
    assert e["preference_tuned_preference_accuracy"] >= e["sft_preference_accuracy"]
    assert np.isfinite(e["preference_tuned_loss"]) and e["preference_tuned_loss"] < e["base_loss"]
    # DVCLive's curves of the run, as MaxText reported them.
    train = preference_run.root / "dvclive-preference" / "plots" / "metrics" / "train"
    losses = [float(line.split("\t")[1]) for line in (train / "loss.tsv").read_text().splitlines()[1:]]
    assert len(losses) == 16 and losses[-1] < losses[0] == pytest.approx(np.log(2), abs=1e-4)
    assert (train / "reward_accuracy.tsv").exists() and (train / "reward_margin.tsv").exists()
