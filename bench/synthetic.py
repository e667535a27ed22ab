"""Synthetic chat data with UltraChat 200k's shape, for benchmarks and scale tests (the Hub is
out of reach here, so the real set cannot be read).

    python -m bench.synthetic 207865 data.jsonl    # a full-size train_sft stand-in
"""

import json
import random
import sys

WORDS = (
    "the model data train token answer question people water history system language light number city "
    "world time river music energy school market plant health computer science story value power game "
    "because however between through during without against another example important different"
).split()


def ultrachat_like(n: int, seed: int = 0) -> list[dict]:
    return list(conversations(n, seed))


def conversations(n: int, seed: int = 0):
    """Conversations shaped like UltraChat 200k's train_sft, one at a time: 1-6 user/assistant
    exchanges (mean ~3), a templated length drawn log-normally (median ~1,100 Gemma tokens,
    long tail, a few over 2,048), assistants writing ~85% of it. Words are ~1 token each;
    benchmarks print the measured lengths. (No network here to read the real set; this is
    its published shape, approximated.)"""
    rng = random.Random(seed)
    for _ in range(n):
        exchanges = min(6, 1 + int(rng.expovariate(1 / 2.0)))
        words = max(40, int(rng.lognormvariate(7.0, 0.6)))  # e^7 ~ 1,100
        per_exchange = max(8, words // exchanges)
        messages = []
        for _ in range(exchanges):
            user = max(4, int(per_exchange * 0.15))
            messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=user))})
            messages.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=per_exchange - user))})
        yield {"messages": messages}


if __name__ == "__main__":
    n, out = int(sys.argv[1]), sys.argv[2]
    with open(out, "w") as f:
        for row in conversations(n):
            f.write(json.dumps(row) + "\n")
