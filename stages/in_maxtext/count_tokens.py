"""How many tokens MaxText's SFT pipeline makes of each conversation, and how many it trains
on, for every row of a split; the same for the conversation cut after each assistant turn
(what `train.long_conversations: whole_turns` keeps of a long one).

Run by the token_lengths stage (through stages.in_maxtext.main, for MaxText's environment):

    python -m stages.in_maxtext.main stages.in_maxtext.count_tokens --setup '{...}' --request \
        '{"tokenizer": "models/base-hf", "rendering": "whole", "splits": {"data/chat/train.jsonl": "train", ...}}' --

Writes, for each split, <out>.npy (tokens per row, before max_target_length cuts it) and
<out>-turns.npz: `turns` (assistant turns per row) and, flat, row after row, `cut_tokens` and
`cut_trained` for the conversation ending after its 1st, 2nd, ... assistant turn (the last
is the whole conversation).

`rendering` whole (train.chat_rendering, the default): the conversation as served
(stages/shared/rendering.py), rendered once, tokenized in batches by the Rust tokenizer; a
conversation cut after turn k is the template's rendering of its first messages, and trains
on the same answers' tokens as the whole one's first k. `per_round`: MaxText 0.2.5's own
functions (input_pipeline_utils: apply_chat_template, tokenization), row by row.
"""

import json

import numpy as np

from stages.shared import contract

REQUEST = contract.CountTokens

BATCH = 1024  # conversations rendered and tokenized at once: memory stays flat however large the split


def load_tokenizer(path: str):
    import transformers

    # As MaxText's preprocessing_pipeline loads it when use_sft is set: no BOS or EOS added
    # by the tokenizer (the chat template writes them).
    return transformers.AutoTokenizer.from_pretrained(
        path, add_bos_token=False, add_eos_token=False, legacy=False, extra_special_tokens={}
    )


def assistant_ends(messages: list[dict]) -> list[int]:
    """The message count of the conversation cut after each assistant turn."""
    return [i + 1 for i, m in enumerate(messages) if m["role"] == "assistant"]


def whole_counts(tokenizer, batch: list[list[dict]]) -> list[tuple[int, list[int], list[int]]]:
    """(tokens, cut_tokens, cut_trained) of each conversation, rendered as served."""
    from stages.shared import rendering

    rendered = rendering.render_many(tokenizer, batch)
    cuts = [messages[:end] for messages in batch for end in assistant_ends(messages)[:-1]]
    cut_lengths = iter(
        len(ids)
        for ids in (
            tokenizer(tokenizer.apply_chat_template(cuts, tokenize=False), add_special_tokens=False)["input_ids"]
            if cuts
            else []
        )
    )
    out = []
    for r in rendered:
        trained = np.cumsum(r.trained)
        cut_trained = [int(trained[end - 1]) for end in r.turn_ends]
        cut_tokens = [next(cut_lengths) for _ in r.turn_ends[:-1]] + [len(r.ids)]
        out.append((len(r.ids), cut_tokens, cut_trained))
    return out


def per_round_counts(tokenizer, messages: list[dict]) -> tuple[int, list[int], list[int]]:
    """The same, by MaxText 0.2.5's own functions: each round templated alone."""
    from maxtext.input_pipeline import input_pipeline_utils as mt

    example = mt.apply_chat_template({"messages": messages}, tokenizer, "messages")
    example = mt.tokenization(example, tokenizer, truncation=False, max_length=None, column_names=["messages"])
    lengths = [len(ids) for ids in example["messages"]]  # prompt, completion, prompt, completion, ...
    tokens = np.cumsum(lengths)[1::2]
    trained = np.cumsum([n if not prompt else 0 for n, prompt in zip(lengths, example["is_prompt"], strict=True)])
    return int(tokens[-1]), [int(t) for t in tokens], [int(t) for t in trained[1::2]]


def read(jsonl: str):
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)["messages"]


def batches(rows, size: int):
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def count(tokenizer, jsonl: str, rendering: str) -> dict[str, np.ndarray]:
    tokens, turns, cut_tokens, cut_trained = [], [], [], []
    for batch in batches(read(jsonl), BATCH):
        if rendering == "whole":
            counted = whole_counts(tokenizer, batch)
        else:
            counted = [per_round_counts(tokenizer, messages) for messages in batch]
        for total, cuts, trained in counted:
            tokens.append(total)
            turns.append(len(cuts))
            cut_tokens += cuts
            cut_trained += trained
    found = {"tokens": tokens, "turns": turns, "cut_tokens": cut_tokens, "cut_trained": cut_trained}
    return {name: np.asarray(values, dtype=np.int32) for name, values in found.items()}


def run(request: contract.CountTokens, maxtext_flags: list[str], setup: contract.Setup) -> None:
    tokenizer = load_tokenizer(request.tokenizer)
    for jsonl, out in request.splits.items():
        found = count(tokenizer, jsonl, request.rendering)
        np.save(f"{out}.npy", found.pop("tokens"))
        np.savez(f"{out}-turns.npz", **found)
        print(f"token_lengths: {jsonl} counted ({request.rendering} rendering)", flush=True)
