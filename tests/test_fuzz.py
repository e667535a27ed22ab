"""Whatever bytes a data file holds and whatever a user writes in params.yaml, reading them
ends in good rows / valid params or in one line naming the row or key: never a traceback.
Property tests (hypothesis) over the dataset stage's reader and the params loader."""

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages.lib import chat, params
from stages.shared.errors import UserError
from tools.recipe import params_text

ROOT = Path(__file__).resolve().parents[1]
TINY = params_text("tiny")
GOOD_ROWS = (ROOT / "assets" / "tiny-chat" / "train.jsonl").read_bytes().splitlines(keepends=True)[:20]
FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def read_split(path: Path, on_bad_row: str) -> tuple[list, list]:
    """The dataset stage's reading of one split: (rows kept, rows skipped), or UserError."""
    selection = chat.Selection(str(path), "messages", on_bad_row, max_skipped_fraction=1.0)
    kept = list(selection.rows(chat.read_jsonl(str(path))))
    for record in kept:  # what is kept is what the stage can write and MaxText can read
        json.loads(json.dumps(record, ensure_ascii=False).encode("utf-8"))
        assert chat.problem(record) is None
    return kept, selection.skipped


def assert_one_line(e: UserError) -> None:
    said = str(e)
    assert said and "\n" not in said and "Traceback" not in said, said


def mutated(data: st.DataObject) -> bytes:
    """Good rows, then some of them cut short, a byte flipped, random bytes inserted."""
    rows = list(data.draw(st.lists(st.sampled_from(GOOD_ROWS), min_size=1, max_size=8)))
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(rows) - 1))
        row = rows[i]
        at = data.draw(st.integers(0, len(row)))
        kind = data.draw(st.sampled_from(["cut", "flip", "insert"]))
        if kind == "cut":
            rows[i] = row[:at] + b"\n"
        elif kind == "flip" and at < len(row):
            rows[i] = row[:at] + bytes([row[at] ^ data.draw(st.integers(1, 255))]) + row[at + 1 :]
        else:
            rows[i] = row[:at] + data.draw(st.binary(max_size=12)) + row[at:]
    return b"".join(rows)


@FUZZ
@given(content=st.binary(max_size=2000), on_bad_row=st.sampled_from(["stop", "skip"]))
def test_random_bytes(tmp_path, content, on_bad_row):
    path = tmp_path / "train.jsonl"
    path.write_bytes(content)
    try:
        read_split(path, on_bad_row)
    except UserError as e:
        assert_one_line(e)
        assert str(e).startswith(str(path))


@FUZZ
@given(data=st.data(), on_bad_row=st.sampled_from(["stop", "skip"]))
def test_mutated_valid_rows(tmp_path, data, on_bad_row):
    path = tmp_path / "train.jsonl"
    path.write_bytes(mutated(data))
    try:
        kept, skipped = read_split(path, on_bad_row)
    except UserError as e:
        assert_one_line(e)
        assert ", row " in str(e) or "no rows" in str(e), str(e)
        return
    assert all(", row " not in s["reason"] and s["row"] >= 1 for s in skipped)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "bot", ""]) | JSON_VALUES,
        "content": st.text() | JSON_VALUES,
    }
)


@FUZZ
@given(
    rows=st.lists(
        st.fixed_dictionaries({"messages": st.lists(MESSAGE, max_size=5) | JSON_VALUES}) | JSON_VALUES,
        min_size=1,
        max_size=6,
    ),
    on_bad_row=st.sampled_from(["stop", "skip"]),
)
def test_any_json_value(tmp_path, rows, on_bad_row):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        read_split(path, on_bad_row)
    except UserError as e:
        assert_one_line(e)


@pytest.mark.parametrize(
    "content,reason",
    [
        ("[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
        ('{"messages": "' + "\\ud800" + '"}\n', "'messages' must be a non-empty list"),
        (
            '{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "x"}]}\n',
            "lone surrogate",
        ),
        ("caf\xe9\n", "not UTF-8 text"),
    ],
    ids=["deep", "surrogate-messages", "surrogate-content", "latin-1"],
)
def test_named_hostile_rows(tmp_path, content, reason):
    path = tmp_path / "train.jsonl"
    path.write_bytes(
        content.encode("latin-1") if reason == "not UTF-8 text" else content.encode("utf-8", "surrogatepass")
    )
    with pytest.raises(UserError) as e:
        read_split(path, "stop")
    assert_one_line(e.value)
    assert f"{path}, row 1: " in str(e.value) and reason in str(e.value), str(e.value)


def test_other_encodings_are_refused_with_the_row(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"".join(GOOD_ROWS[:2]).decode().encode("utf-16"))
    with pytest.raises(UserError, match=r"row 1: not UTF-8 text"):
        read_split(path, "stop")


def test_an_overlong_line_is_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "MAX_ROW_BYTES", 1000)
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD_ROWS[0] + b'{"messages": "' + b"x" * 5000 + b'"}\n' + GOOD_ROWS[1])
    kept, skipped = read_split(path, "skip")
    assert len(kept) == 2 and skipped == [{"row": 2, "reason": "longer than 1,000 bytes; not a conversation"}]


def test_skipping_stops_at_the_stated_fraction(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"".join(GOOD_ROWS[:19]) + b'{"messages": []}\n')  # 1 bad row of 20: 5%
    selection = chat.Selection(str(path), "messages", "skip", max_skipped_fraction=0.05)
    assert len(list(selection.rows(chat.read_jsonl(str(path))))) == 19
    assert selection.skipped == [{"row": 20, "reason": "'messages' must be a non-empty list"}]
    with pytest.raises(
        UserError,
        match=r"1 of 20 rows are bad \(5%\), more than dataset.max_skipped_fraction=0.04; "
        r"the first, row 20: 'messages' must be a non-empty list",
    ):
        list(chat.Selection(str(path), "messages", "skip", max_skipped_fraction=0.04).rows(chat.read_jsonl(str(path))))


def load_text(tmp_path: Path, text) -> None:
    path = tmp_path / "params.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        params.load(str(path))
    except UserError as e:
        assert_one_line(e)
        assert str(e).startswith(str(path)), str(e)


@FUZZ
@given(content=st.binary(max_size=500))
def test_params_from_random_bytes(tmp_path, content):
    load_text(tmp_path, content)


@FUZZ
@given(data=st.data())
def test_params_mutated_from_a_recipe(tmp_path, data, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = TINY
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        text = text[:at] + data.draw(st.text(max_size=6)) + text[at + data.draw(st.integers(0, 6)) :]
    load_text(tmp_path, text)


YAML_TREES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=15,
)


@FUZZ
@given(tree=YAML_TREES, section=st.sampled_from(sorted(yaml.safe_load(TINY))))
def test_params_any_yaml_tree(tmp_path, tree, section, monkeypatch):
    monkeypatch.chdir(ROOT)
    recipe = yaml.safe_load(TINY)
    recipe[section] = tree  # one section replaced by anything
    load_text(tmp_path, yaml.safe_dump(recipe))
    load_text(tmp_path, yaml.safe_dump(tree))


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 50_000 + "]" * 50_000,
        "&a [*a]",
        "x: !!python/object:os.system {}",
        "train:\n  steps: " + "9" * 5000,
        "\ufeff" + TINY,
        "- - - -\n" * 1000,
    ],
    ids=["deep", "alias-loop", "python-tag", "huge-int", "bom", "nested-lists"],
)
def test_params_hostile_yaml(tmp_path, text, monkeypatch):
    monkeypatch.chdir(ROOT)
    load_text(tmp_path, text)
