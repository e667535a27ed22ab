"""Instruction-following data checked by code (stages/constraints.py, stages/lib/instructions.py)
and the SFT model's own preference pairs (stages/self_pairs.py): every kind made to hold by its
transform and held by its checker (IFEval's own for IFEval's kinds), kinds that cannot hold
together kept apart, no IFEval prompt nor any 8-word run of one in the data, and the stages'
wiring on the tiny model: constraint examples trained beside the chat rows, pairs the tiny SFT
model answers itself, through preference_data to train_dpo's texts."""

import collections
import json
import random
import re

import pytest

from stages import constraints, self_pairs
from stages.lib import benchmark_data, decontamination, instructions, package_data
from testkit.workspace import clone_workspace, copy_project, set_param, sh, stages_run

ANSWER = (
    "Paris is the capital of France, and it sits on the Seine. It has been the seat of government for centuries. "
    "The city is known for its museums, such as the Louvre and the Orsay. Many visitors come each year to see the "
    "Eiffel Tower, which was finished in 1889. Its cafes and bakeries are famous too. The metro carries about 4 "
    "million riders a day."
)
REQUEST = "Tell me about the capital of France."
IFEVAL = decontamination.BENCHMARKS["ifeval"][0]  # the pinned file of its prompts
RUN = 8  # words: a run this long shared with an IFEval prompt is contamination


@pytest.fixture(scope="module", autouse=True)
def sentence_model(tmp_path_factory):
    benchmark_data.nltk_data(str(tmp_path_factory.mktemp("nltk")))  # IFEval's sentence model, offline


def runs(text: str, n: int = RUN) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def ifeval_runs() -> tuple[set[str], set[tuple[str, ...]]]:
    with open(package_data.locate(IFEVAL, "IFEval's prompts")) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    return set(prompts), set().union(*(runs(p) for p in prompts))


@pytest.mark.parametrize("kind_id", sorted(instructions.KINDS))
def test_each_kind_made_to_hold_by_code_holds_by_its_checker(kind_id):
    """On an English answer of six sentences, each kind's transform (where its draw finds it
    applicable, for several seeds) makes an answer its checker passes, IFEval's own for IFEval's
    kinds; the untransformed answer fails where the kind asks for a change."""
    kind = instructions.KINDS[kind_id]
    applied = 0
    for seed in range(6):
        answer = ANSWER if kind_id != "pipeline:one_word" else "Yes, it is. " + ANSWER
        args = kind.draw(random.Random(seed), answer, REQUEST)
        if args is None:
            continue
        transformed = kind.apply(answer, args)
        assert instructions.follows(kind_id, args, transformed), (kind_id, args, transformed)
        applied += 1
        phrase = instructions.phrase(kind, args, random.Random(seed))
        assert "{" not in phrase and phrase.strip(), phrase
    assert applied, f"{kind_id}: never applicable to a six-sentence answer"


def test_kinds_that_cannot_hold_together_are_kept_apart():
    kinds = sorted(instructions.KINDS)
    for a in kinds:
        for b in kinds:
            assert instructions.conflicts(a, b) == instructions.conflicts(b, a), (a, b)
    assert instructions.conflicts("change_case:english_lowercase", "change_case:english_capital")
    assert instructions.conflicts("detectable_format:json_format", "startend:quotation")  # IFEval's own table
    assert instructions.conflicts("pipeline:exact_sentences", "startend:end_checker")  # adds a sentence
    assert not instructions.conflicts("punctuation:no_comma", "detectable_format:title")


def test_an_example_is_kept_only_if_its_answer_passes_every_check():
    """Made from a two-turn conversation: the conversation up to one of its user turns, the
    instructions added to that turn in our words, the answer transformed; re-checked here."""
    messages = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": REQUEST},
        {"role": "assistant", "content": ANSWER},
    ]
    settings = {"max_answer_words": 150, "max_instructions": 3}
    counts = {k: {"kept": 0, "failed": 0, "dropped_with_another": 0, "not_applicable": 0} for k in instructions.KINDS}
    made = [constraints.make_example(messages, random.Random(seed), settings, counts) for seed in range(40)]
    made = [m for m in made if m]
    assert len(made) >= 25, counts
    for example in made:
        turn, original = example["messages"][-1], messages[len(example["messages"]) - 1]["content"]
        assert turn["role"] == "user" and turn["content"] != original and original in turn["content"]
        assert 1 <= len(example["instructions"]) <= 3
        for check in example["instructions"]:
            assert instructions.follows(check["id"], check["args"], example["answer"]), (check, example["answer"])
    assert {len(m["messages"]) for m in made} == {1, 3}  # the first turn, and the second in context


def test_our_wording_shares_no_run_of_words_with_ifeval():
    """Every phrasing, its arguments filled in, and every fixed phrase an answer gains (end
    phrases, postscripts), shares no 5-word run (stricter than the 8 the data is held to) with
    any of IFEval's 541 prompts."""
    _, banned = ifeval_runs()
    short = {r[:5] for r in banned}
    texts = [p for k in instructions.KINDS.values() for p in k.phrasings]
    texts += [*instructions.END_PHRASES, *instructions.POSTSCRIPTS]
    for text in texts:
        shared = runs(re.sub(r"\{\w+\}", "it", text), 5) & short
        assert not shared, (text, shared)


LOWER = {
    "messages": [{"role": "user", "content": "Describe Paris. Write only in lowercase letters."}],
    "instructions": [{"id": "change_case:english_lowercase", "args": {}}],
    "answer": "paris is the capital of france.",
    "original": "Paris is the capital of France.",
}


@pytest.mark.parametrize(
    "said, origin, chosen, rejected",
    [
        # one obeys, one does not: the model's own two
        ([("it sits on the seine.", True), ("It sits on the Seine.", True)], "sampled_pass_vs_fail", 0, 1),
        # all obey: the transformed answer over the conversation's own, which does not
        ([("it sits on the seine.", True)] * 2, "transformed_vs_original", "answer", "original"),
        # none obeys: lowercase, but run on past max_new_tokens (cut off fails all the same)
        ([("it sits on the seine and", False)] * 2, "transformed_vs_sampled_fail", "answer", 0),
        # nothing said
        ([(" ", False), ("", True)], "no_pair", None, None),
    ],
)
def test_a_pair_is_an_answer_that_obeys_over_one_that_does_not(said, origin, chosen, rejected):
    answers = [self_pairs.Answer(text, ended) for text, ended in said]
    row, got = self_pairs.pair(LOWER, answers, random.Random(0), collections.Counter())
    assert got == origin
    if row is None:
        assert chosen is None
        return
    assert row["chosen"][:-1] == row["rejected"][:-1] == LOWER["messages"]
    side = {"answer": LOWER["answer"], "original": LOWER["original"], 0: said[0][0], 1: said[1][0]}
    assert row["chosen"][-1] == {"role": "assistant", "content": side[chosen]}
    assert row["rejected"][-1] == {"role": "assistant", "content": side[rejected]}


@pytest.mark.slow
def test_real_conversations_give_checked_examples_and_none_holds_ifeval(tmp_path):
    """The small-chat-v5e-1-if recipe's data stages on the real ShareGPT conversations: the
    examples (30% of SFT's rows, and 400 held out for pairs), each passing every checker it
    carries when read back; the counts per kind in DVC's metrics; and no IFEval prompt, nor any
    8-word run of one, anywhere in what SFT or the pairs are made of."""
    root = copy_project(tmp_path / "ws", "small-chat-v5e-1-if")
    set_param(root, "runtime.check_hardware", False)  # (the data stages need no chip)
    sh(["python", "-m", "stages.dataset"], root)
    out = sh(["python", "-m", "stages.constraints"], root).stdout
    assert "training examples (30% of SFT's rows), 400 held out" in out, out
    metrics = json.loads((root / "metrics" / "constraints.json").read_text())["constraints"]
    chat_rows = metrics["chat_rows"]
    assert metrics["train_rows"] == round(0.3 / 0.7 * chat_rows) and metrics["heldout_rows"] == 400
    assert all(v["kept"] > 0 for k, v in metrics["kinds"].items() if k != "pipeline:one_word"), metrics["kinds"]
    train = [json.loads(line) for line in (root / "data" / "constraints" / "train.jsonl").open()]
    checks = [json.loads(line) for line in (root / "data" / "constraints" / "train-checks.jsonl").open()]
    heldout = [json.loads(line) for line in (root / "data" / "constraints" / "heldout.jsonl").open()]
    assert len(train) == len(checks) == metrics["train_rows"]
    for row, check in zip(train, checks, strict=True):
        answer = row["messages"][-1]["content"]
        assert all(instructions.follows(c["id"], c["args"], answer) for c in check["instructions"]), (check, answer)
    for row in heldout:
        assert all(instructions.follows(c["id"], c["args"], row["answer"]) for c in row["instructions"])
    prompts, banned = ifeval_runs()
    texts = [m["content"] for row in train for m in row["messages"]]
    texts += [m["content"] for row in heldout for m in row["messages"]] + [r["answer"] for r in heldout]
    texts += [
        m["content"] for line in (root / "data" / "chat" / "train.jsonl").open() for m in json.loads(line)["messages"]
    ]
    for text in texts:
        assert text not in prompts and not runs(text) & banned, text[:300]


@pytest.mark.slow
def test_the_tiny_models_own_pairs_reach_train_dpo(tiny_run, tmp_path):
    """On the tiny run: constraint examples beside the chat rows (the constraints stage, and
    token_lengths and train after it), then the SFT model's own sampled answers to the
    held-out prompts checked by code and paired (self_pairs, MaxText's engine on this CPU),
    read by preference_data as a local source into train_dpo's texts."""
    root = clone_workspace(tiny_run, tmp_path)
    set_param(root, "constraints.share", 0.2)
    set_param(root, "constraints.heldout", 12)
    set_param(root, "preference.enabled", True)
    set_param(root, "preference.self_pairs.enabled", True)
    set_param(root, "preference.self_pairs.samples", 2)
    set_param(root, "preference.self_pairs.max_new_tokens", 24)
    data = {"source": "local", "local_dir": "data/self-pairs", "train_split": "train", "eval_split": "eval"}
    for key, value in data.items():
        set_param(root, f"preference.data.{key}", value)
    proc = sh(["dvc", "repro", "preference_data"], root, timeout=2400)
    ran = stages_run(proc.stdout)
    assert ran[:3] == ["constraints", "token_lengths", "train"] and ran[-2:] == ["self_pairs", "preference_data"], ran
    made = json.loads((root / "metrics" / "constraints.json").read_text())["constraints"]
    assert made["train_rows"] == round(0.2 / 0.8 * made["chat_rows"]) and made["heldout_rows"] == 12
    summary = json.loads((root / "dvclive" / "metrics.json").read_text())
    assert summary["run"]["constraint_rows"] == made["train_rows"], summary["run"]
    assert summary["run"]["rows"] == made["chat_rows"] + made["train_rows"]
    pairs = json.loads((root / "metrics" / "self_pairs.json").read_text())["self_pairs"]
    assert pairs["prompts"] == 12 and pairs["answers"] == 24 and sum(pairs["pairs"].values()) == 12
    texts = [json.loads(line) for line in (root / "data" / "preference" / "train.jsonl").open()]
    assert texts and all(t["chosen"] != t["rejected"] for t in texts)
    _, banned = ifeval_runs()
    for line in (root / "data" / "self-pairs" / "train.jsonl").open():
        row = json.loads(line)
        assert not any(runs(m["content"]) & banned for m in row["chosen"] + row["rejected"])
