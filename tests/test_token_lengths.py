"""Tokens per conversation (stages/lib/token_lengths.py): the batched count is the count
MaxText's own SFT functions make, row for row."""

import json
import sys
from pathlib import Path

import pytest

from stages.lib import token_lengths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tiny_base):
    return token_lengths.load_tokenizer(str(tiny_base))


def conversations() -> list[list[dict]]:
    tiny = [json.loads(line)["messages"] for line in (ROOT / "assets" / "tiny-chat" / "train.jsonl").read_text().splitlines()]
    sys.path.insert(0, str(ROOT / "bench"))
    from synthetic import ultrachat_like

    long = [r["messages"] for r in ultrachat_like(40, seed=3)]
    system = [[{"role": "system", "content": "Be brief."}, *m] for m in long[:10]]
    odd = [[{"role": "user", "content": "  spaces \n\n and\ttabs  "}, {"role": "assistant", "content": "<b>é</b> 東京 🙂"}]]
    return tiny[:60] + long + system + odd


def test_rounds_end_with_the_assistant_and_keep_the_system_message_first():
    m = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
         {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    assert token_lengths.rounds(m) == [m[:3], m[3:]]


def test_the_batched_count_is_maxtexts_count(tokenizer):
    rows = conversations()
    fast = token_lengths.fast_lengths(tokenizer, rows)
    assert len(fast) == len(rows)
    assert list(fast) == [token_lengths.maxtext_length(tokenizer, m) for m in rows]
    assert fast.max() > 1000  # multi-round, long conversations are among them


def test_a_split_is_counted_and_checked(tokenizer, tmp_path):
    path = tmp_path / "train.jsonl"
    rows = conversations()[:30]
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    found, how = token_lengths.lengths(tokenizer, str(path))
    assert list(found) == list(token_lengths.fast_lengths(tokenizer, rows))
    assert how == "batched, 30 rows checked against MaxText's own functions"
