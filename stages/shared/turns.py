"""Prompts as chat turns, and where a generated answer ends: what both processes need to put a
question to a model and read its answer back the same way (the benchmark stage's greedy
answers and tools.answers, in transformers on the host or MaxText's engine on a chip).

Standard library only.
"""

UNFINISHED = "(stopped at benchmark.max_new_tokens: it did not end its turn)"


def conversation(prompt) -> list[dict]:
    """A prompt as the messages the chat template renders: a string is one user turn."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def cut(text: str, ends: list[str]) -> tuple[str, bool]:
    """A generated text up to the first of `ends` (the end of turn, EOS, padding), and whether
    one came (the answer ended its turn)."""
    at = min((text.index(e) for e in ends if e in text), default=None)
    return (text[:at].strip(), True) if at is not None else (text.strip(), False)
