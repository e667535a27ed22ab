"""Chat rows in UltraChat's format, and the checks they must pass before training.

A row is {"messages": [{"role": ..., "content": ...}, ...]}. MaxText's SFT pipeline applies
the tokenizer's chat template turn by turn and trains on assistant turns; Gemma 3's template
accepts an optional leading system message, then strictly alternating user/assistant turns.
Anything else fails inside MaxText minutes into a run, or is silently mis-masked, so it is
caught here with the row number.
"""

ROLES = ("system", "user", "assistant")


def problem(row) -> str | None:
    """What is wrong with one row, or None if it is trainable."""
    if not isinstance(row, dict):
        return f"expected an object with a 'messages' list, got {type(row).__name__}"
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    expected = "user"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
            return f"messages[{i}]: expected {{role, content}}, got {m!r:.80}"
        role, content = m["role"], m["content"]
        if role not in ROLES:
            return f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}"
        if not isinstance(content, str) or not content.strip():
            return f"messages[{i}].content: must be a non-empty string"
        if role == "system":
            if i != 0:
                return f"messages[{i}]: a system message is only allowed first"
            continue
        if role != expected:
            return f"messages[{i}].role: expected {expected} (turns must alternate user/assistant), got {role}"
        expected = "assistant" if role == "user" else "user"
    if messages[-1]["role"] != "assistant":
        return "the last message must be from the assistant (nothing would be trained on)"
    return None
