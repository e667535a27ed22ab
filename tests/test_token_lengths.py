"""Tokens per conversation (stages/in_maxtext/count_tokens.py) and what the train stage does
with conversations over max_target_length (stages/lib/long_rows.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

from stages.in_maxtext import count_tokens
from stages.lib import long_rows
from stages.shared import rendering
from stages.shared.errors import UserError

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

    long = [r["messages"] for r in ultrachat_like(20, seed=3)]
    system = [[{"role": "system", "content": "Be brief."}, *m] for m in long[:5]]
    odd = [
        [{"role": "user", "content": "  spaces \n\n and\ttabs  "}, {"role": "assistant", "content": "<b>é</b> 東京 🙂"}]
    ]
    return tiny[:20] + long + system + odd


def write(path: Path, rows: list[list[dict]]) -> str:
    path.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in rows))
    return str(path)


def test_whole_counts_are_the_served_rendering_and_its_cuts(tokenizer, tmp_path):
    """Every row's tokens and trained tokens as rendering.render gives them; cut after turn k,
    the template's rendering of its first messages, training on its first k answers."""
    rows = conversations()
    found = count_tokens.count(tokenizer, write(tmp_path / "train.jsonl", rows), "whole")
    assert list(found["turns"]) == [sum(m["role"] == "assistant" for m in r) for r in rows]
    starts = np.concatenate([[0], np.cumsum(found["turns"])])
    for i, messages in enumerate(rows):
        rendered = rendering.render(tokenizer, messages)
        assert found["tokens"][i] == len(rendered.ids)
        cut_tokens = found["cut_tokens"][starts[i] : starts[i + 1]]
        cut_trained = found["cut_trained"][starts[i] : starts[i + 1]]
        assert cut_tokens[-1] == len(rendered.ids) and cut_trained[-1] == sum(rendered.trained)
        for k, end in enumerate(count_tokens.assistant_ends(messages)):
            cut = rendering.render(tokenizer, messages[:end])
            assert (cut_tokens[k], cut_trained[k]) == (len(cut.ids), sum(cut.trained))
    assert found["tokens"].max() > 1000  # multi-round, long conversations are among them


def test_per_round_counts_are_maxtexts_own(tokenizer, tmp_path):
    """train.chat_rendering per_round: MaxText 0.2.5's functions, which count more (a BOS per round)."""
    rows = conversations()[20:30]
    per_round = count_tokens.count(tokenizer, write(tmp_path / "train.jsonl", rows), "per_round")
    whole = count_tokens.count(tokenizer, write(tmp_path / "train.jsonl", rows), "whole")
    extra_bos = whole["turns"] - 1
    assert list(per_round["tokens"]) == list(whole["tokens"] + extra_bos)


def counts_dir(tmp_path: Path, monkeypatch, rows: list[list[dict]], cuts: list[list[int]]) -> None:
    """A project directory whose data/lengths says each row's cut lengths (trained: half)."""
    (tmp_path / "data" / "chat").mkdir(parents=True)
    (tmp_path / "data" / "lengths").mkdir(parents=True)
    (tmp_path / "data" / "constraints").mkdir(parents=True)
    write(tmp_path / "data" / "chat" / "train.jsonl", rows)
    (tmp_path / "data" / "constraints" / "train.jsonl").write_text("")  # (the constraints stage off)
    np.save(tmp_path / "data" / "lengths" / "constraints.npy", np.zeros(0, dtype=np.int32))
    empty = np.zeros(0, dtype=np.int32)
    np.savez(tmp_path / "data" / "lengths" / "constraints-turns.npz", turns=empty, cut_tokens=empty, cut_trained=empty)
    flat = [n for c in cuts for n in c]
    np.save(tmp_path / "data" / "lengths" / "train.npy", np.asarray([c[-1] for c in cuts], dtype=np.int32))
    np.savez(
        tmp_path / "data" / "lengths" / "train-turns.npz",
        turns=np.asarray([len(c) for c in cuts], dtype=np.int32),
        cut_tokens=np.asarray(flat, dtype=np.int32),
        cut_trained=np.asarray([n // 2 for n in flat], dtype=np.int32),
    )
    monkeypatch.chdir(tmp_path)


def turns(n: int) -> list[dict]:
    return [
        m for i in range(n) for m in ({"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"})
    ]


@pytest.mark.parametrize(
    "policy, kept_turns, summary",
    [
        ("truncate", [1, 3, 2], {"rows_cut": 0, "rows_dropped": 0, "trained_tokens_before_truncation": 20 + 35 + 45}),
        ("drop", [1], {"rows_cut": 0, "rows_dropped": 2, "trained_tokens": 20}),
        ("whole_turns", [1, 2], {"rows_cut": 1, "rows_dropped": 1, "trained_tokens": 20 + 22}),
    ],
)
def test_long_conversations_are_kept_cut_or_dropped_by_the_policy(tmp_path, monkeypatch, policy, kept_turns, summary):
    """Max length 50: a row of 40 tokens fits; one of 3 turns (20, 45, 70) is cut after its 2nd;
    one whose first turn is 60 fits nowhere."""
    rows = [turns(1), turns(3), turns(2)]
    counts_dir(tmp_path, monkeypatch, rows, [[40], [20, 45, 70], [60, 90]])
    params = {"train": {"long_conversations": policy, "max_target_length": 50}}
    fitted = long_rows.fit(params, str(tmp_path))
    kept = [json.loads(line)["messages"] for line in Path(fitted.rows).read_text().splitlines()]
    assert [sum(m["role"] == "assistant" for m in r) for r in kept] == kept_turns
    assert fitted.summary["rows_over_max_target_length"] == 2
    assert {k: fitted.summary[k] for k in summary} == summary
    assert len(fitted.lengths) == len(kept)
    assert policy == "truncate" or all(n <= 50 for n in fitted.lengths)
    assert long_rows.said(fitted.summary, 50).startswith("2 of 3 training conversations are longer")


def test_a_policy_that_leaves_no_row_says_so_in_one_line(tmp_path, monkeypatch):
    counts_dir(tmp_path, monkeypatch, [turns(1)], [[60]])
    with pytest.raises(UserError, match=r"train.long_conversations: drop leaves no training conversation"):
        long_rows.fit({"train": {"long_conversations": "drop", "max_target_length": 50}}, str(tmp_path))
