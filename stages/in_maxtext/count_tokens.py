"""How many tokens MaxText's SFT pipeline makes of each conversation, for every row of a split.

Run by the token_lengths stage (through stages.in_maxtext.main, for MaxText's environment):

    python -m stages.in_maxtext.main stages.in_maxtext.count_tokens -- --tokenizer models/base-hf \
        --split data/chat/train.jsonl train.npy --split data/chat/eval.jsonl eval.npy

MaxText's pipeline (hf_data_processing, use_sft) templates each user/assistant round on its
own (`input_pipeline_utils.apply_chat_template`, which splits it into prompt and completion)
and tokenizes the pieces; a conversation's length is the sum over its rounds, before
max_target_length cuts it. Doing exactly that per row is ~6 tokenizer passes per round, in
Python; here every round is templated once and all rounds are tokenized in batches by the
Rust tokenizer, on every core. The two agree row for row (tests/test_token_lengths.py); each
run also checks a sample of rows against MaxText's own functions and, should a template
ever make them differ, computes every row MaxText's way instead.
"""

import argparse
import json
import random

import numpy as np

SAMPLE = 64  # rows checked against MaxText's own functions in every run
BATCH = 4096  # rounds tokenized at once: memory stays flat however large the split


def load_tokenizer(path: str):
    import transformers

    # As MaxText's preprocessing_pipeline loads it when use_sft is set: no BOS or EOS added
    # by the tokenizer (the chat template writes them).
    return transformers.AutoTokenizer.from_pretrained(
        path, add_bos_token=False, add_eos_token=False, legacy=False, extra_special_tokens={}
    )


def rounds(messages: list[dict]) -> list[list[dict]]:
    """The conversation as MaxText templates it: one list per round, ending with the
    assistant's turn (a leading system message belongs to the first round)."""
    out, current = [], []
    for m in messages:
        current.append(m)
        if m["role"] == "assistant":
            out.append(current)
            current = []
    return out


def fast_lengths(tokenizer, conversations) -> np.ndarray:
    owners, pending, found = [], [], []
    backend = tokenizer.backend_tokenizer

    def flush():
        texts = tokenizer.apply_chat_template(pending, tokenize=False)
        found.extend(len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=False))
        pending.clear()

    n = 0
    for n, messages in enumerate(conversations, start=1):
        for r in rounds(messages):
            owners.append(n - 1)
            pending.append(r)
        if len(pending) >= BATCH:
            flush()
    if pending:
        flush()
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, np.asarray(owners, dtype=np.int64), np.asarray(found, dtype=np.int64))
    return out.astype(np.int32)


def maxtext_length(tokenizer, messages: list[dict]) -> int:
    """One conversation's length computed by MaxText's own functions."""
    from maxtext.input_pipeline import input_pipeline_utils as mt

    example = mt.apply_chat_template({"messages": messages}, tokenizer, "messages")
    example = mt.tokenization(example, tokenizer, truncation=False, max_length=None, column_names=["messages"])
    return sum(len(ids) for ids in example["messages"])


def read(jsonl: str):
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)["messages"]


def lengths(tokenizer, jsonl: str, seed: int = 0) -> tuple[np.ndarray, str]:
    """(every row's length, how it was computed)."""
    found = fast_lengths(tokenizer, read(jsonl))
    sample = sorted(random.Random(seed).sample(range(len(found)), min(SAMPLE, len(found))))
    rows = {i: m for i, m in enumerate(read(jsonl)) if i in set(sample)}
    if all(maxtext_length(tokenizer, rows[i]) == found[i] for i in sample):
        return found, f"batched, {len(sample)} rows checked against MaxText's own functions"
    print(
        "token_lengths: the batched count differs from MaxText's on this chat template; counting every row "
        "MaxText's way (slower)",
        flush=True,
    )
    return np.asarray([maxtext_length(tokenizer, m) for m in read(jsonl)], dtype=np.int32), "MaxText's own functions"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--split", nargs=2, action="append", required=True, metavar=("JSONL", "NPY"))
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    for jsonl, out in args.split:
        found, how = lengths(tokenizer, jsonl)
        np.save(out, found)
        median = int(np.median(found)) if len(found) else 0
        print(f"token_lengths: {len(found)} rows of {jsonl}, median {median} tokens ({how})", flush=True)


if __name__ == "__main__":
    main()
