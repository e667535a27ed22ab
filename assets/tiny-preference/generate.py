"""Writes the tiny and small recipes' preference pairs from the chat data beside them.

    python assets/tiny-preference/generate.py

Each conversation of assets/tiny-chat/<split>.jsonl becomes one pair in UltraFeedback
binarized's shape (`prompt`, `chosen` and `rejected` message lists): the rejected answer is
the chat data's own, the chosen one is the same answer closed with a sign-off. SFT on the
chat data teaches the plain answers, so the SFT model prefers the rejected side; the
preference is one SFT never taught, and one a model can learn from a few hundred pairs and
carry to conversations it has not seen (the held-out split comes from the chat data's
held-out split). Deterministic: the same files every run.
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(os.path.dirname(HERE), "tiny-chat")
SIGN_OFF = "Hope that helps!"


def pair(messages: list[dict]) -> dict:
    *conversation, answer = messages
    user = next(m["content"] for m in reversed(conversation) if m["role"] == "user")
    closed = {"role": "assistant", "content": f"{answer['content']} {SIGN_OFF}"}
    return {"prompt": user, "chosen": [*conversation, closed], "rejected": [*conversation, answer]}


def main() -> None:
    for split in ("train", "eval"):
        with open(os.path.join(CHAT, f"{split}.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line)["messages"] for line in f if line.strip()]
        with open(os.path.join(HERE, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(pair(m), ensure_ascii=False) + "\n" for m in rows)
        print(f"{split}: {len(rows)} pairs")


if __name__ == "__main__":
    main()
