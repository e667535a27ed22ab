"""Writes the tiny recipe's chat data: train.jsonl and eval.jsonl beside this file.

    python assets/tiny-chat/generate.py

UltraChat's format (one JSON object per line, a `messages` list of {role, content}), small
enough to train on a laptop CPU in a minute, and regular enough that a tiny model learns
it: every answer follows a fixed template, so held-out loss visibly drops after fine-tuning.
Multi-turn conversations and system prompts are included so the chat-template and
completion-only masking paths are exercised. Deterministic: the files are committed, and
re-running this script reproduces them byte for byte.
"""

import json
import os
import random

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Canada": "Ottawa",
    "Egypt": "Cairo",
    "Norway": "Oslo",
    "Chile": "Santiago",
    "India": "New Delhi",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Ghana": "Accra",
    "Cuba": "Havana",
    "Nepal": "Kathmandu",
    "Poland": "Warsaw",
    "Greece": "Athens",
    "Mexico": "Mexico City",
    "Brazil": "Brasilia",
    "Sweden": "Stockholm",
    "Vietnam": "Hanoi",
}
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
ANIMALS = ["cat", "dog", "fox", "owl", "horse", "whale", "rabbit", "tiger"]
SYSTEM_PROMPTS = ["You are a concise assistant.", "Answer in one sentence.", "You are a helpful tutor."]


def arithmetic(rng):
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    msgs = [
        {"role": "user", "content": f"What is {a} plus {b}?"},
        {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
    ]
    if rng.random() < 0.4:
        msgs += [
            {"role": "user", "content": "And if you double that?"},
            {"role": "assistant", "content": f"Doubled, {a + b} becomes {2 * (a + b)}."},
        ]
    return msgs


def capital(rng):
    country = rng.choice(sorted(CAPITALS))
    msgs = [
        {"role": "user", "content": f"What is the capital of {country}?"},
        {"role": "assistant", "content": f"The capital of {country} is {CAPITALS[country]}."},
    ]
    if rng.random() < 0.3:
        other = rng.choice(sorted(CAPITALS))
        msgs += [
            {"role": "user", "content": f"And of {other}?"},
            {"role": "assistant", "content": f"The capital of {other} is {CAPITALS[other]}."},
        ]
    return msgs


def reverse(rng):
    word = rng.choice(ANIMALS + COLOURS)
    return [
        {"role": "user", "content": f"Spell the word {word} backwards."},
        {"role": "assistant", "content": f"{word} backwards is {word[::-1]}."},
    ]


def sort_numbers(rng):
    nums = rng.sample(range(1, 100), rng.randint(3, 6))
    listed = ", ".join(map(str, nums))
    return [
        {"role": "user", "content": f"Sort these numbers from smallest to largest: {listed}."},
        {"role": "assistant", "content": "In order: " + ", ".join(map(str, sorted(nums))) + "."},
    ]


def describe(rng):
    colour, animal = rng.choice(COLOURS), rng.choice(ANIMALS)
    return [
        {"role": "user", "content": f"Describe a {colour} {animal} in a few words."},
        {"role": "assistant", "content": f"A {colour} {animal}: a {animal} whose coat is {colour}, easy to spot."},
    ]


KINDS = [arithmetic, capital, reverse, sort_numbers, describe]


def conversation(rng):
    msgs = rng.choice(KINDS)(rng)
    if rng.random() < 0.2:
        msgs = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + msgs
    return {"messages": msgs}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for split, count, seed in (("train", 320, 0), ("eval", 64, 1)):
        rng = random.Random(seed)
        with open(os.path.join(here, f"{split}.jsonl"), "w") as f:
            for _ in range(count):
                f.write(json.dumps(conversation(rng)) + "\n")


if __name__ == "__main__":
    main()
