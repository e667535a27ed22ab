"""MaxText's SFT input pipeline fed conversations as they are served (stages/shared/rendering.py).

MaxText 0.2.5 (input_pipeline/hf_data_processing.py, use_sft) turns a conversation into
tokens in two functions of `input_pipeline_utils`, each looked up on that module when its
pipeline is built:
  apply_chat_template  the conversation -> a list of text pieces and which are prompt; its
                       own renders each round alone (a BOS before every round, Qwen 3's think
                       block in every answer)
  tokenization         each piece tokenized on its own, the tokenizer's specials added
`install()` replaces both, nothing else: the first with the whole conversation rendered once
and cut into untrained and trained runs of whole tokens; the second tokenizes the joined
pieces in one pass, without added specials, and splits the ids where the pieces meet. So the
ids MaxText trains on are `apply_chat_template(messages, tokenize=True)` exactly (its later
`max_target_length` cut aside), and its completion-only mask (SFTPromptMasking) leaves
exactly the assistant turns trained. Everything after (masking, packing, shifting) is
MaxText's own. Rows of other pipelines (DPO's texts) go to the stock tokenization.

Installed by stages/in_maxtext/main.py where the stage asks for it (train.chat_rendering
whole, the default): training, its resume replay, evaluate's held-out loss.
"""

import numpy as np
from maxtext.input_pipeline import input_pipeline_utils

from stages.shared import rendering

_stock_tokenization = input_pipeline_utils.tokenization  # taken at import: before install() replaces it


def apply_chat_template(example, tokenizer_model, data_column_name):
    """MaxText's signature: `example[data_column_name]` becomes the rendered text's pieces,
    `example["is_prompt"]` says which are untrained."""
    try:
        pieces = rendering.render(tokenizer_model, list(example[data_column_name])).pieces()
    except rendering.RenderError as e:
        raise ValueError(f"Unable to apply chat template: {e}") from None
    example[data_column_name] = [text for text, _ in pieces]
    example["is_prompt"] = [not trained for _, trained in pieces]
    return example


def split_ids(ids: list[int], offsets: list, pieces: list[str]) -> list[list[int]]:
    """The ids of the joined pieces, split where each piece starts (every piece starts at a
    token: rendering.Rendered.pieces)."""
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    token_starts = np.asarray([o[0] for o in offsets], dtype=np.int64)
    cuts = np.searchsorted(token_starts, starts[1:], side="left")
    return [list(part) for part in np.split(np.asarray(ids, dtype=np.int64), cuts)]


def tokenization(example, hf_tokenizer, truncation, max_length, column_names):
    """MaxText's signature (a batch of rows): SFT rows' pieces tokenized as one text each."""
    if "is_prompt" not in example:
        return _stock_tokenization(example, hf_tokenizer, truncation, max_length, column_names)
    for column in column_names:
        rows = example[column]
        encoded = hf_tokenizer(
            ["".join(pieces) for pieces in rows], add_special_tokens=False, return_offsets_mapping=True
        )
        example[column] = [
            split_ids(ids, offsets, pieces)
            for ids, offsets, pieces in zip(encoded["input_ids"], encoded["offset_mapping"], rows, strict=True)
        ]
    return example


def install() -> None:
    input_pipeline_utils.apply_chat_template = apply_chat_template
    input_pipeline_utils.tokenization = tokenization
