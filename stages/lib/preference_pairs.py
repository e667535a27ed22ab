"""Preference pairs: the checks a pair must pass before MaxText's train_dpo sees it, and the
text it then reads.

A pair is two answers to one conversation, the preferred (`chosen`) and the other
(`rejected`). Source rows come in one of two shapes (`preference.data.format`):
  messages  UltraFeedback binarized's: `chosen` and `rejected` are {role, content} lists,
            the same conversation in both, each ending in its own assistant answer; an
            optional `prompt` string repeats the last user turn
  text      train_dpo's documented shape (Anthropic/hh-rlhf): `chosen` and `rejected` are
            strings each holding the whole exchange; the prompt is what they share
What train_dpo reads (MaxText's HF pipeline, `train_data_columns=['chosen','rejected']`) is
one text per side. MaxText tokenizes each (adding BOS and EOS as the tokenizer says), takes
their common token prefix as the prompt and the rest of each as its answer
(input_pipeline/dpo_utils.py: DPODataFormatting). So a `messages` pair is rendered with the
base model's chat template, the template's own BOS left for the tokenizer to add. (Where
the two answers begin with the same tokens, those join the prompt: they would add the same
log-probability to both sides, which DPO's loss subtracts.)

A bad pair either stops the stage or is skipped and recorded (chat.Selection, the chat
data's policy): a missing or empty side, identical answers, sides that differ before their
answers (not the same prompt), a turn order the chat template refuses.
"""

from stages.lib import chat

FORMATS = ("messages", "text")


def _messages_problem(side: str, value) -> str | None:
    if not isinstance(value, list) or not value:
        return f"'{side}' must be a non-empty list of {{role, content}} messages"
    bad = chat.problem({"messages": value})
    return f"{side}: {bad}" if bad else None


def from_messages(row: dict) -> tuple[dict | None, str | None]:
    """{"conversation": [...], "chosen": answer, "rejected": answer}, or what is wrong."""
    for side in ("chosen", "rejected"):
        if side not in row:
            return None, f"no '{side}' column"
        bad = _messages_problem(side, row[side])
        if bad:
            return None, bad
    chosen, rejected = row["chosen"], row["rejected"]
    if chosen[:-1] != rejected[:-1]:
        return None, "chosen and rejected differ before their last message: they must answer the same conversation"
    answers = chosen[-1]["content"], rejected[-1]["content"]
    if answers[0].strip() == answers[1].strip():
        return None, "chosen and rejected give the same answer: there is nothing to prefer"
    prompt = row.get("prompt")
    if prompt is not None:
        last_user = next(m["content"] for m in reversed(chosen[:-1]) if m["role"] == "user")
        if not isinstance(prompt, str) or prompt.strip() != last_user.strip():
            return None, "'prompt' differs from the conversation's last user message"
    return {"conversation": chosen[:-1], "chosen": answers[0], "rejected": answers[1]}, None


def from_text(row: dict) -> tuple[dict | None, str | None]:
    """{"chosen": text, "rejected": text}, or what is wrong."""
    for side in ("chosen", "rejected"):
        if not isinstance(row.get(side), str) or not row[side].strip():
            return None, f"'{side}' must be a non-empty string (the whole exchange)"
    chosen, rejected = row["chosen"], row["rejected"]
    if chosen.strip() == rejected.strip():
        return None, "chosen and rejected are the same text: there is nothing to prefer"
    prompt = row.get("prompt")
    if prompt is not None and (
        not isinstance(prompt, str) or not chosen.startswith(prompt) or not rejected.startswith(prompt)
    ):
        return None, "'prompt' is not where both chosen and rejected begin"
    shared = common_prefix(chosen, rejected)
    if not chosen[:shared].strip():
        return None, "chosen and rejected share no prompt: they must begin with the same exchange"
    if shared in (len(chosen), len(rejected)):
        return None, "one side is the other cut short: each needs an answer after the shared prompt"
    return {"chosen": chosen, "rejected": rejected}, None


def parser(fmt: str):
    """The row check for a format: row -> (pair, None) or (None, problem)."""

    def parse(value) -> tuple[dict | None, str | None]:
        if not isinstance(value, dict):
            return None, f"expected an object with 'chosen' and 'rejected', got {type(value).__name__}"
        return from_messages(value) if fmt == "messages" else from_text(value)

    return parse


def render(pair: dict, tokenizer) -> dict:
    """The two texts train_dpo reads. A `messages` pair through the chat template (the
    template's leading BOS text removed: MaxText's tokenizer adds BOS itself, and two would
    be a sequence the model never saw)."""
    if "conversation" not in pair:
        return {"chosen": pair["chosen"], "rejected": pair["rejected"]}
    out = {}
    for side in ("chosen", "rejected"):
        messages = [*pair["conversation"], {"role": "assistant", "content": pair[side]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if tokenizer.bos_token and text.startswith(tokenizer.bos_token):
            text = text[len(tokenizer.bos_token) :]
        out[side] = text
    return out


def common_prefix(a, b) -> int:
    """How many leading items (characters, token ids) two sequences share."""
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def split_lengths(chosen_ids: list[int], rejected_ids: list[int]) -> tuple[int, int, int]:
    """(prompt, chosen answer, rejected answer) token counts as DPODataFormatting splits them:
    the prompt is the common prefix."""
    shared = common_prefix(chosen_ids, rejected_ids)
    return shared, len(chosen_ids) - shared, len(rejected_ids) - shared
