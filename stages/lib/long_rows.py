"""What the train stage does with conversations longer than `train.max_target_length` tokens
(`train.long_conversations`), decided from the token_lengths stage's counts before MaxText
starts, and counted in the run's summary:

  truncate     MaxText cuts the row at max_target_length (its own behaviour): the tail,
               usually the end of an answer and its end-of-turn marker, is never trained on
  drop         the row is left out
  whole_turns  the row ends after its last assistant turn that fits, its end-of-turn marker
               included (the template's rendering of its first messages); a row whose first
               answer does not fit is left out

The rows train streams are data/chat/train.jsonl for truncate (or when nothing is too long),
else a copy written once into the run's working directory (`fitted.jsonl`), with the
lengths of its rows for packing; with constraint examples (data/constraints/train.jsonl, the
constraints stage's), always that copy: the chat rows, then the examples.
"""

import json
import os
from dataclasses import dataclass

import numpy as np

from stages.lib import paths
from stages.shared.errors import UserError

POLICIES = ("truncate", "drop", "whole_turns")
FITTED = "fitted.jsonl"


@dataclass(frozen=True)
class Fitted:
    rows: str  # the JSONL the streams are made of
    lengths: np.ndarray  # its rows' tokens (as rendered for training)
    summary: dict  # what the policy did, for the run's summary


def counts(split: str = "train") -> tuple[np.ndarray, dict]:
    """The token_lengths stage's counts of a split: tokens per row, and per row the tokens
    and trained tokens of the conversation cut after each assistant turn. The training rows
    are the chat rows, then the constraint examples (`training_sources`)."""
    parts = [split, "constraints"] if split == "train" else [split]
    found = []
    for part in parts:
        lengths = np.load(os.path.join(paths.LENGTHS, f"{part}.npy"))
        with np.load(os.path.join(paths.LENGTHS, f"{part}-turns.npz")) as turns:
            found.append((lengths, {key: turns[key] for key in turns.files}))
    lengths = np.concatenate([f[0] for f in found]).astype(np.int32)
    return lengths, {key: np.concatenate([f[1][key] for f in found]) for key in found[0][1]}


def training_sources() -> list[str]:
    """The files SFT trains on, in the order token_lengths counted them: the chat rows
    (data/chat/train.jsonl) and the constraint examples (data/constraints/train.jsonl)."""
    return [os.path.join(paths.DATA, "train.jsonl"), os.path.join(paths.CONSTRAINTS, "train.jsonl")]


def lines(sources: list[str]):
    """The non-empty lines of the sources, in order."""
    for source in sources:
        with open(source, encoding="utf-8") as f:
            yield from (line for line in f if line.strip())


def turns_kept(cut_tokens: np.ndarray, max_length: int) -> int:
    """How many of a row's assistant turns fit in max_length (its cut_tokens per turn)."""
    return int(np.searchsorted(cut_tokens, max_length, side="right"))


def fit(params: dict, out_dir: str) -> Fitted:
    """The rows training streams under the recipe's policy (written once per working
    directory: `out_dir`)."""
    t = params["train"]
    policy, max_length = t["long_conversations"], t["max_target_length"]
    lengths, turns = counts()
    starts = np.concatenate([[0], np.cumsum(turns["turns"])]).astype(np.int64)
    trained = turns["cut_trained"][starts[1:] - 1].astype(np.int64)  # each row's whole conversation
    over = lengths > max_length
    # Assistant turns kept of each row: all (-1), none (0: dropped) or the first k.
    kept = np.full(len(lengths), -1)
    for i in np.flatnonzero(over):
        cuts = turns["cut_tokens"][starts[i] : starts[i + 1]]
        kept[i] = turns_kept(cuts, max_length) if policy == "whole_turns" else 0
    summary = {
        "long_conversations": policy,
        "rows": int(len(lengths)),
        "rows_over_max_target_length": int(over.sum()),
        "rows_cut": int((kept > 0).sum()) if policy != "truncate" else 0,
        "rows_dropped": int((kept == 0).sum()) if policy != "truncate" else 0,
    }
    sources = [s for s in training_sources() if os.path.getsize(s)]
    if len(sources) > 1:
        summary["constraint_rows"] = int(len(np.load(os.path.join(paths.LENGTHS, "constraints.npy"))))
    if len(sources) == 1 and (policy == "truncate" or not over.any()):
        summary["trained_tokens_before_truncation" if over.any() else "trained_tokens"] = int(trained.sum())
        return Fitted(sources[0], lengths, summary)
    if not (kept != 0).any():
        raise UserError(
            f"train.long_conversations: {policy} leaves no training conversation: none fits in "
            f"train.max_target_length={max_length} tokens; raise it, or choose truncate"
        )
    out, kept_lengths, kept_trained = os.path.join(out_dir, FITTED), [], 0
    tmp = f"{out}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as dst:
        for i, line in enumerate(lines(sources)):
            k = kept[i]
            if k == -1:
                dst.write(line if line.endswith("\n") else line + "\n")
                kept_lengths.append(lengths[i])
                kept_trained += int(trained[i])
            elif k > 0:
                messages = json.loads(line)["messages"]
                ends = [j + 1 for j, m in enumerate(messages) if m["role"] == "assistant"]
                dst.write(json.dumps({"messages": messages[: ends[k - 1]]}, ensure_ascii=False) + "\n")
                kept_lengths.append(turns["cut_tokens"][starts[i] + k - 1])
                kept_trained += int(turns["cut_trained"][starts[i] + k - 1])
    os.replace(tmp, out)
    summary["trained_tokens"] = kept_trained
    return Fitted(out, np.asarray(kept_lengths, dtype=np.int32), summary)


def said(summary: dict, max_length: int) -> str:
    """The policy's effect in one line, for the stage's output."""
    over, rows = summary["rows_over_max_target_length"], summary["rows"]
    if not over:
        return f"every one of the {rows} training conversations fits in train.max_target_length={max_length} tokens"
    head = f"{over} of {rows} training conversations are longer than train.max_target_length={max_length} tokens: "
    policy = summary["long_conversations"]
    if policy == "truncate":
        return head + "MaxText truncates them (train.long_conversations: truncate), so their ends are never trained on"
    if policy == "drop":
        return head + "left out (train.long_conversations: drop)"
    return head + (
        f"{summary['rows_cut']} end after their last assistant turn that fits, {summary['rows_dropped']} whose first "
        "answer does not fit are left out (train.long_conversations: whole_turns)"
    )
