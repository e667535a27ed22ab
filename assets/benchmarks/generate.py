"""Writes the local benchmark tasks' data: arithmetic.jsonl and capitals.jsonl beside this file.

    python assets/benchmarks/generate.py

Items written for this pipeline's suite, in the shapes of two kinds of lm-eval task (the task
definitions are the YAML files here): `chat_arithmetic`, free-form answers scored by exact match
of the last number (GSM8K's kind), and `chat_capitals`, a choice among four cities scored by
log-likelihood (MMLU's kind). They ask what the tiny chat data (assets/tiny-chat) teaches, with
other numbers and other countries than it holds, so a fine-tuned model can do better than its
base on them without having seen an item. Deterministic: the files are committed, and re-running
this script reproduces them byte for byte.
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
# Countries the chat data does not ask about (assets/tiny-chat/generate.py's CAPITALS), with
# their capitals; the wrong choices are other capitals of this list.
CAPITALS = {
    "Germany": "Berlin",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Ireland": "Dublin",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Hungary": "Budapest",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Argentina": "Buenos Aires",
    "Colombia": "Bogota",
    "Venezuela": "Caracas",
    "Thailand": "Bangkok",
    "Indonesia": "Jakarta",
    "Philippines": "Manila",
    "South Korea": "Seoul",
    "China": "Beijing",
    "Russia": "Moscow",
    "Turkey": "Ankara",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Morocco": "Rabat",
    "Ethiopia": "Addis Ababa",
    "Nigeria": "Abuja",
    "Australia": "Canberra",
    "New Zealand": "Wellington",
    "Ukraine": "Kyiv",
    "Czechia": "Prague",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Serbia": "Belgrade",
    "Croatia": "Zagreb",
}


def trained_sums() -> set[tuple[int, int]]:
    """The (a, b) the chat data asks "What is a plus b?" about."""
    found = set()
    with open(os.path.join(HERE, "..", "tiny-chat", "train.jsonl")) as f:
        for line in f:
            for m in json.loads(line)["messages"]:
                words = m["content"].rstrip("?").split()
                if m["role"] == "user" and words[:2] == ["What", "is"] and "plus" in words:
                    found.add((int(words[2]), int(words[4])))
    return found


def arithmetic(rng: random.Random, n: int = 40) -> list[dict]:
    # Small numbers, which a model of a few hundred million parameters can add, in pairs the
    # chat data never asks about: no item is a training conversation.
    seen, rows = trained_sums(), []
    while len(rows) < n:
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"question": f"What is {a} plus {b}?", "answer": str(a + b)})
    return rows


def capitals(rng: random.Random) -> list[dict]:
    # Each choice a whole answer in the chat data's words, so that a model that has learnt to
    # answer "The capital of X is Y." is scored on Y, not on whether it starts with a city.
    rows = []
    cities = sorted(CAPITALS.values())
    for country in sorted(CAPITALS):
        wrong = rng.sample([c for c in cities if c != CAPITALS[country]], 3)
        choices = sorted([CAPITALS[country], *wrong])
        rows.append(
            {
                "country": country,
                "choices": [f"The capital of {country} is {city}." for city in choices],
                "answer": choices.index(CAPITALS[country]),
            }
        )
    return rows


def write(name: str, rows: list[dict]) -> None:
    with open(os.path.join(HERE, name), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    rng = random.Random(27)
    write("arithmetic.jsonl", arithmetic(rng))
    write("capitals.jsonl", capitals(rng))
