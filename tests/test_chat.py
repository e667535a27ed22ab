"""The chat-row checks (stages/lib/chat.py): what Gemma 3's chat template can train on."""

import pytest

from stages.lib import chat


def row(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


@pytest.mark.parametrize(
    "good",
    [
        row(("user", "Hi"), ("assistant", "Hello.")),
        row(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello.")),
        row(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")),
        row(("user", "naïve café, 東京"), ("assistant", "✓")),
    ],
    ids=["one-turn", "system-first", "multi-turn", "unicode"],
)
def test_trainable_rows_pass(good):
    assert chat.problem(good) is None


@pytest.mark.parametrize(
    "bad,message",
    [
        ([1, 2], "expected an object with a 'messages' list, got list"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": "hi"}, "'messages' must be a non-empty list"),
        ({"conversations": []}, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "user"}]}, "messages[0]: expected {role, content}"),
        ({"messages": [{"role": "user", "content": "a", "name": "x"}]}, "messages[0]: expected {role, content}"),
        (row(("user", "Hi"), ("bot", "Hello.")), "messages[1].role: 'bot' is not one of system, user, assistant"),
        (
            row(("user", "a"), ("user", "b"), ("assistant", "c")),
            "messages[1].role: expected assistant (turns must alternate user/assistant), got user",
        ),
        (
            row(
                ("assistant", "a"),
            ),
            "messages[0].role: expected user",
        ),
        (row(("user", "  "), ("assistant", "c")), "messages[0].content: must be a non-empty string"),
        (
            {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]},
            "messages[0].content: must be a non-empty string",
        ),
        (
            row(("user", "a"), ("system", "b"), ("assistant", "c")),
            "messages[1]: a system message is only allowed first",
        ),
        (row(("user", "a"), ("assistant", "b"), ("user", "c")), "the last message must be from the assistant"),
        (
            row(
                ("system", "only a system prompt"),
            ),
            "the last message must be from the assistant",
        ),
    ],
    ids=[
        "not-object",
        "empty",
        "not-list",
        "no-messages",
        "no-content",
        "extra-field",
        "unknown-role",
        "not-alternating",
        "assistant-first",
        "blank",
        "not-string",
        "system-later",
        "ends-with-user",
        "system-only",
    ],
)
def test_each_untrainable_row_is_named(bad, message):
    said = chat.problem(bad)
    assert said is not None and said.startswith(message), said


def selected(rows, fmt, column, on_bad_row="stop", fraction=0.0):
    selection = chat.Selection("data.jsonl", column, on_bad_row, fraction, fmt)
    return list(selection.rows((i, r, None) for i, r in enumerate(rows, start=1))), selection


def test_sharegpt_rows_become_messages():
    rows = [
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello."},
            ],
            "id": 7,
        }
    ]
    got, _ = selected(rows, "sharegpt", "conversations")
    assert got == [row(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."))]


def test_prompt_completion_rows_become_one_exchange():
    got, _ = selected([{"prompt": "2+2?", "completion": "4", "source": "x"}], "prompt_completion", None)
    assert got == [row(("user", "2+2?"), ("assistant", "4"))]


@pytest.mark.parametrize(
    "fmt,column,bad,message",
    [
        ("sharegpt", "conversations", {"messages": []}, "no 'conversations' column"),
        ("sharegpt", "conversations", {"conversations": "hi"}, "'conversations' must be a list of {from, value} turns"),
        (
            "sharegpt",
            "conversations",
            {"conversations": [{"from": "human", "text": "a"}]},
            "conversations[0]: expected {from, value}",
        ),
        (
            "sharegpt",
            "conversations",
            {"conversations": [{"from": "bot", "value": "a"}]},
            "conversations[0].from: 'bot' is not one of system, human, gpt",
        ),
        (
            "sharegpt",
            "conversations",
            {"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]},
            "messages[1].role: expected assistant",
        ),  # the turn checks are the same for every format
        ("prompt_completion", None, {"prompt": "a"}, "expected string fields 'prompt' and 'completion'"),
        (
            "prompt_completion",
            None,
            {"prompt": "a", "completion": ""},
            "messages[1].content: must be a non-empty string",
        ),
        ("prompt_completion", None, [1], "expected an object, got list"),
    ],
    ids=[
        "no-column",
        "not-list",
        "wrong-keys",
        "unknown-from",
        "not-alternating",
        "no-completion",
        "empty-completion",
        "not-object",
    ],
)
def test_each_format_names_its_bad_rows(fmt, column, bad, message):
    with pytest.raises(chat.UserError) as e:
        selected([bad], fmt, column)
    assert str(e.value).startswith(f"data.jsonl, row 1: {message}"), str(e.value)
