"""Chat rows in UltraChat's format, and the checks they must pass before training.

A row is {"messages": [{"role": ..., "content": ...}, ...]}. MaxText's SFT pipeline applies
the tokenizer's chat template turn by turn and trains on assistant turns; Gemma 3's template
accepts an optional leading system message, then strictly alternating user/assistant turns.
Anything else fails inside MaxText minutes into a run, or is silently mis-masked, so it is
caught here with the row number.
"""

import os

from stages.lib import paths
from stages.lib.maxtext import flag

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


def maxtext_data_args(params: dict, train_file: str | None = None) -> list[str]:
    """How chat rows become token batches: shared by training and the evaluate stage, so that
    held-out loss is measured on exactly what training optimises."""
    t = params["train"]
    return [
        f"tokenizer_path={os.path.abspath(paths.BASE_HF)}",
        "hf_path=json",
        f"hf_train_files={os.path.abspath(train_file or os.path.join(paths.DATA, 'train.jsonl'))}",
        "train_split=train",
        "train_data_columns=['messages']",
        f"hf_eval_files={os.path.abspath(os.path.join(paths.DATA, 'eval.jsonl'))}",
        "hf_eval_split=train",  # a JSON file's only split, whatever it is called upstream
        "eval_data_columns=['messages']",
        f"max_target_length={t['max_target_length']}",
        f"packing={flag(t['packing'])}",
        f"sft_train_on_completion_only={flag(t['completion_only_loss'])}",
    ]


def count_too_long(jsonl_path: str, tokenizer_dir: str, max_length: int, batch: int = 256) -> tuple[int, int]:
    """(conversations longer than max_length tokens once templated, all conversations).

    MaxText truncates such rows silently: the end of the conversation, usually the answer it
    should learn, is never trained on. Counting them first lets the train stage say so.
    """
    import json

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    too_long = total = 0
    with open(jsonl_path) as f:
        rows = (json.loads(line)["messages"] for line in f if line.strip())
        while chunk := [m for _, m in zip(range(batch), rows)]:
            ids = tokenizer.apply_chat_template(chunk, tokenize=True, return_dict=True)["input_ids"]
            too_long += sum(len(x) > max_length for x in ids)
            total += len(chunk)
    return too_long, total
