"""Multi-turn conversations are trained as they are served (stages/shared/rendering.py,
stages/in_maxtext/served_chat.py), for every family: the ids MaxText's input pipeline emits
are the chat template's rendering of the whole conversation, and the tokens it trains on are
exactly the assistant turns, content and end-of-turn marker.

The expected mask here is built from each family's template as documented (where an answer
starts: the generation prompt of the conversation before it; Gemma 3 and Llama 3 trim an
answer; Qwen 3 puts an empty think block before the last one), not from the code under test.

    python -m pytest tests/test_served_chat.py -m "not slow"
"""

import json
from pathlib import Path

import pytest

from stages.shared import rendering
from stages.shared.families import gemma3, llama3, qwen3
from testkit.workspace import set_param, sh

# A system prompt, three rounds, unicode (accents, CJK, an emoji), tabs and padded answers.
CONVERSATION = [
    {"role": "system", "content": "You are terse. Réponds en français si on te parle français."},
    {"role": "user", "content": "Bonjour ! Qu'est-ce que 2+2 ? 🙂"},
    {"role": "assistant", "content": "4. C'est simple — « quatre »."},
    {"role": "user", "content": "And in Japanese?\n\tTabs too."},
    {"role": "assistant", "content": "四 (yon). 日本語です。"},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "  You're welcome!  "},
]
SHORT = [
    {"role": "user", "content": "Name a fruit."},
    {"role": "assistant", "content": "An apple."},
    {"role": "user", "content": "What colour is it?"},
    {"role": "assistant", "content": "Red, usually."},
]
# What each family's template does, as its documentation and files say.
MARKER = {gemma3: "<end_of_turn>", llama3: "<|eot_id|>", qwen3: "<|im_end|>"}
TRIMS_ANSWERS = {gemma3: True, llama3: True, qwen3: False}
LAST_TURN_PREFIX = {gemma3: "", llama3: "", qwen3: "<think>\n\n</think>\n\n"}
# And what MaxText 0.2.5's own rendering, round by round, adds (the skew being fixed).
PER_ROUND_EXTRA = {gemma3: "<bos>", llama3: "<|begin_of_text|>", qwen3: "<think>\n\n</think>\n\n"}
FAMILIES = [gemma3, llama3, qwen3]
RECIPE = {gemma3: "tiny", llama3: "tiny-llama3", qwen3: "tiny-qwen3"}


def test_every_family_has_its_expectations_here():
    """A new family fails here until its template's behaviour is written in the tables above."""
    from stages.shared import families

    assert {f.NAME for f in FAMILIES} == {f.NAME for f in families.all_families()}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict:
    """Each family's real tokenizer, as MaxText loads it (count_tokens.load_tokenizer)."""
    from stages.in_maxtext.count_tokens import load_tokenizer
    from stages.shared import tiny

    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family.__name__.rsplit(".", 1)[-1])
        if family is qwen3:
            source = Path(tiny.maxtext_asset("assets", "tokenizers", "qwen3-tokenizer"))
            for f in source.iterdir():
                (path / f.name).write_bytes(f.read_bytes())
        else:
            for name, content in family._tokenizer_files().items():
                (path / name).write_bytes(content)
        out[family] = load_tokenizer(str(path))
    return out


def expected(tokenizer, family, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """The template's ids of the whole conversation, and the mask training must use."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    trained = [False] * len(ids)
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i in answers:
        prompt = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
        if i == answers[-1]:
            prompt += LAST_TURN_PREFIX[family]
        assert text.startswith(prompt)
        start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        answer = messages[i]["content"].strip() if TRIMS_ANSWERS[family] else messages[i]["content"]
        assert text[len(prompt) :].startswith(answer + MARKER[family])
        count = len(tokenizer(answer + MARKER[family], add_special_tokens=False)["input_ids"])
        assert ids[start + count - 1] == tokenizer.convert_tokens_to_ids(MARKER[family])
        trained[start : start + count] = [True] * count
    return ids, trained


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.NAME)
@pytest.mark.parametrize("messages", [CONVERSATION, SHORT], ids=["system-3-rounds-unicode", "2-rounds"])
def test_a_conversation_renders_as_served_and_trains_on_the_answers_alone(tokenizers, family, messages):
    tokenizer = tokenizers[family]
    rendered = rendering.render(tokenizer, messages)
    ids, trained = expected(tokenizer, family, messages)
    assert rendered.ids == ids
    assert rendered.trained == trained
    assert rendered.turn_ends == [
        i + 1 for i, t in enumerate(trained) if t and (i + 1 == len(ids) or not trained[i + 1])
    ]
    pieces = rendered.pieces()
    assert "".join(text for text, _ in pieces) == rendered.text
    assert [t for t in (tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in pieces) for t in t] == ids
    assert rendering.end_of_turn(tokenizer) == MARKER[family] == family.END_OF_TURN


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.NAME)
def test_maxtexts_own_rendering_differs_as_described(tokenizers, family):
    """MaxText 0.2.5's own functions (what served_chat replaces) render each round alone: the
    skew exists, so the pipeline test below would fail without the fix."""
    from stages.in_maxtext.count_tokens import per_round_counts

    tokenizer = tokenizers[family]
    from maxtext.input_pipeline import input_pipeline_utils as mt

    example = mt.apply_chat_template({"messages": [dict(m) for m in CONVERSATION]}, tokenizer, "messages")
    text = "".join(example["messages"])
    served = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    extra = PER_ROUND_EXTRA[family]
    assert text.count(extra) == served.count(extra) + 2  # once more per later round (Qwen 3: per answer)
    tokens, cut_tokens, _ = per_round_counts(tokenizer, CONVERSATION)
    assert tokens > len(rendering.render(tokenizer, CONVERSATION).ids) and len(cut_tokens) == 3


def test_a_template_that_moves_other_text_with_an_answer_is_refused(tokenizers):
    """Qwen 3's template takes a `</think>` inside an answer as reasoning, and renders that turn
    otherwise: the answer's tokens cannot be located, so the row is refused by name."""
    bad = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hmm</think>Hello"}]
    with pytest.raises(rendering.RenderError, match=r"messages\[1\]"):
        rendering.render(tokenizers[qwen3], bad)


def test_the_pieces_meet_at_token_starts_so_maxtext_splits_ids_exactly(tokenizers):
    """served_chat.tokenization splits the joined text's ids where each piece starts."""
    from stages.in_maxtext.served_chat import split_ids

    tokenizer = tokenizers[gemma3]
    rendered = rendering.render(tokenizer, CONVERSATION)
    pieces = [text for text, _ in rendered.pieces()]
    parts = split_ids(rendered.ids, rendered.offsets, pieces)
    assert [len(p) for p in parts] == [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in pieces]
    assert [t for p in parts for t in p] == rendered.ids


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.NAME)
def test_maxtexts_input_pipeline_emits_the_served_ids_and_mask(workspace, tokenizers, family):
    """MaxText's own SFT input pipeline (its hf_data_processing, as train_sft builds it, with
    the recipe's flags; packing off, so each row is one conversation), through tools.batches."""
    root = workspace(f"served-{RECIPE[family]}", recipe=RECIPE[family])
    (root / "models" / "base-hf").mkdir(parents=True)
    family.build_tiny(str(root / "models" / "base-hf"), seed=0)
    set_param(root, "train.packing", False)
    set_param(root, "train.max_target_length", 512)
    data = root / "multi.jsonl"
    data.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in (CONVERSATION, SHORT)))
    sh(["python", "-m", "tools.batches", "--data", str(data), "--rows", "2", "--json", "rows.json"], root)
    rows = json.loads((root / "rows.json").read_text())["rows"]
    for row, messages in zip(rows, (CONVERSATION, SHORT), strict=True):
        ids, trained = expected(tokenizers[family], family, messages)
        assert row["ids"] == ids
        assert row["trained"] == trained
