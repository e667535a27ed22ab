"""Tokens per conversation (stages/in_maxtext/count_tokens.py): the batched count is the count
MaxText's own SFT functions make, row for row."""

import json
from pathlib import Path

import pytest

from stages.in_maxtext import count_tokens

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tiny_base):
    return count_tokens.load_tokenizer(str(tiny_base))


def conversations() -> list[list[dict]]:
    tiny = [
        json.loads(line)["messages"]
        for line in (ROOT / "assets" / "tiny-chat" / "train.jsonl").read_text().splitlines()
    ]
    from bench.synthetic import ultrachat_like

    long = [r["messages"] for r in ultrachat_like(40, seed=3)]
    system = [[{"role": "system", "content": "Be brief."}, *m] for m in long[:10]]
    odd = [
        [{"role": "user", "content": "  spaces \n\n and\ttabs  "}, {"role": "assistant", "content": "<b>é</b> 東京 🙂"}]
    ]
    return tiny[:60] + long + system + odd


def test_rounds_end_with_the_assistant_and_keep_the_system_message_first():
    m = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    assert count_tokens.rounds(m) == [m[:3], m[3:]]


def test_the_batched_count_is_maxtexts_count(tokenizer):
    rows = conversations()
    fast = count_tokens.fast_lengths(tokenizer, rows)
    assert len(fast) == len(rows)
    assert list(fast) == [count_tokens.maxtext_length(tokenizer, m) for m in rows]
    assert fast.max() > 1000  # multi-round, long conversations are among them


def test_a_split_is_counted_and_checked(tokenizer, tmp_path):
    path = tmp_path / "train.jsonl"
    rows = conversations()[:30]
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    found, how = count_tokens.lengths(tokenizer, str(path))
    assert list(found) == list(count_tokens.fast_lengths(tokenizer, rows))
    assert how == "batched, 30 rows checked against MaxText's own functions"
