"""Chat rows, the checks they must pass before training, and reading them from a file
whatever its bytes.

What training reads is UltraChat's format: {"messages": [{"role": ..., "content": ...}, ...]}.
Source rows come in one of three formats (`dataset.format`), normalised to it first:
  messages            OpenAI-style {role, content} lists, in `dataset.column` (UltraChat's)
  sharegpt            ShareGPT's {from, value} lists, in `dataset.column` (usually
                      "conversations"; from: system, human, gpt)
  prompt_completion   TRL's pairs: a "prompt" and a "completion" string, one exchange
MaxText's SFT pipeline applies the tokenizer's chat template round by round and trains on
the assistant's turns. Every supported family's template (Gemma 3 folds a system message
into the first user turn; Llama 3 and Qwen 3 have a system turn) accepts an optional leading
system message, then strictly alternating user/assistant turns ending with the assistant's.
Anything else fails inside MaxText minutes into a run, or is silently mis-masked, so it is
caught here with the row number. A bad row either stops the dataset stage or is skipped and
recorded (`dataset.on_bad_row`), up to `dataset.max_skipped_fraction` of a split.
"""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from stages.lib import package_data
from stages.shared.errors import UserError

ROLES = ("system", "user", "assistant")
FORMATS = ("messages", "sharegpt", "prompt_completion")
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant"}
# Longer than any conversation a model trains on (UltraChat's longest is ~100 KB): a line
# this long is a broken file, and is not read into memory whole.
MAX_ROW_BYTES = 16 * 2**20


def problem(row, last: str = "assistant") -> str | None:
    """What is wrong with one row, or None if it is trainable (`last` "user": a conversation
    waiting for the model's answer, as a prompt is)."""
    if not isinstance(row, dict):
        return f"expected an object with a 'messages' list, got {type(row).__name__}"
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    expected = "user"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
            return f"messages[{i}]: expected {{role, content}}, got {m!r:.80}"
        role, content = m["role"], m["content"]
        if role not in ROLES:
            return f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}"
        if not isinstance(content, str) or not content.strip():
            return f"messages[{i}].content: must be a non-empty string"
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:
            return f"messages[{i}].content: not valid Unicode (a lone surrogate, e.g. from an escaped \\ud800)"
        if role == "system":
            if i != 0:
                return f"messages[{i}]: a system message is only allowed first"
            continue
        if role != expected:
            return f"messages[{i}].role: expected {expected} (turns must alternate user/assistant), got {role}"
        expected = "assistant" if role == "user" else "user"
    if messages[-1]["role"] != last:
        if last == "user":
            return "the last message must be the user's (the model answers it)"
        return "the last message must be from the assistant (nothing would be trained on)"
    return None


def normalise(value, fmt: str, column: str | None) -> tuple[dict | None, str | None]:
    """A source row in `fmt` as {"messages": [...]}, or (None, what is wrong with its shape).
    The messages themselves are checked afterwards, by `problem`, the same for every format."""
    if not isinstance(value, dict):
        return None, f"expected an object, got {type(value).__name__}"
    if fmt == "prompt_completion":
        if set(value) & {"prompt", "completion"} != {"prompt", "completion"}:
            return None, "expected string fields 'prompt' and 'completion'"
        turns = [("user", value["prompt"]), ("assistant", value["completion"])]
        return {"messages": [{"role": r, "content": c} for r, c in turns]}, None
    if column not in value:
        return None, f"no {column!r} column"
    if fmt == "messages":
        return {"messages": value[column]}, None
    turns = value[column]
    if not isinstance(turns, list):
        return None, f"{column!r} must be a list of {{from, value}} turns"
    messages = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or set(t) != {"from", "value"}:
            return None, f"{column}[{i}]: expected {{from, value}}, got {t!r:.80}"
        if t["from"] not in SHAREGPT_ROLES:
            return None, f"{column}[{i}].from: {t['from']!r} is not one of system, human, gpt"
        messages.append({"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]})
    return {"messages": messages}, None


def read_jsonl(path: str):
    """(row number, value, problem) for every non-blank line of a JSONL file, whatever its
    bytes: a line that is not UTF-8, not JSON, too deep or too long comes with its problem
    (and value None) instead of an exception."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        row_no = 0
        while line := f.readline(MAX_ROW_BYTES + 1):
            row_no += 1
            if len(line) > MAX_ROW_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_ROW_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the remainder of the overlong line
                yield row_no, None, f"longer than {MAX_ROW_BYTES:,} bytes; not a conversation"
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield row_no, None, f"not UTF-8 text (byte {e.start + 1} of the row); save the file as UTF-8"
                continue
            if not text.strip():
                continue
            try:
                yield row_no, json.loads(text), None
            except json.JSONDecodeError as e:
                yield row_no, None, f"not valid JSON ({e.msg} at column {e.colno})"
            except RecursionError:
                yield row_no, None, "nested too deeply to be a conversation"


ARRAY_CHUNK = 1 << 20  # bytes read at a time from a JSON array file


def read_json_array(path: str):
    """(row number, value, problem) for every element of a file holding one JSON array of
    records (ShareGPT's), streamed: a record at a time is decoded, whatever the file's size.
    A file cut off inside its last record (as ShareGPT V3's is) gives that record with its
    problem, for the bad-row policy; a record that is not JSON before the end stops the
    stage with one line (nothing after it could be read)."""
    decoder = json.JSONDecoder()
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None

    def more() -> str:
        try:
            return f.read(ARRAY_CHUNK)
        except UnicodeDecodeError:
            raise UserError(f"{path}: not UTF-8 text; save the file as UTF-8") from None

    with f:
        buffer = more()
        position = len(buffer) - len(buffer.lstrip())
        if not buffer.startswith("[", position):
            raise UserError(f"{path}: not a JSON array of records (it does not start with '[')")
        position, row_no, eof = position + 1, 0, False
        while True:
            while True:  # past the whitespace and comma before the next record
                while position < len(buffer) and buffer[position] in " \t\r\n,":
                    position += 1
                if position < len(buffer) or eof:
                    break
                buffer, position = more(), 0
                eof = not buffer
            if position >= len(buffer) or buffer[position] == "]":
                return
            row_no += 1
            while True:
                try:
                    value, position = decoder.raw_decode(buffer, position)
                    break
                except json.JSONDecodeError as e:
                    if not eof and len(buffer) - position <= MAX_ROW_BYTES:
                        chunk = more()
                        buffer, position, eof = buffer[position:] + chunk, 0, not chunk
                        continue
                    if eof and not buffer.rstrip().endswith("]"):
                        yield row_no, None, "cut off: the file ends inside this record"
                        return
                    raise UserError(
                        f"{path}: record {row_no} is not valid JSON ({e.msg}); nothing after it can be read"
                    ) from None
            yield row_no, value, None


def read_rows(path: str):
    """The rows of a data file: JSON Lines (.jsonl) or one JSON array of records (.json)."""
    if path.endswith(".jsonl"):
        return read_jsonl(path)
    if path.endswith(".json"):
        return read_json_array(path)
    raise UserError(f"{path}: a data file must be JSON Lines (.jsonl) or a JSON array of records (.json)")


def conversation(value, fmt: str, column: str | None) -> tuple[dict | None, str | None]:
    """A source row as a trainable {"messages": [...]}, or (None, what is wrong with it)."""
    record, bad = normalise(value, fmt, column)
    bad = bad or problem(record)
    return (None, bad) if bad else (record, None)


@dataclass
class Selection:
    """Which rows of one split are trained on. A bad row stops the stage (on_bad_row "stop")
    or is skipped and listed in `skipped` (on_bad_row "skip"), and the split fails if more
    than max_skipped_fraction of its rows were bad. `parse` turns a row into the record
    written, or says what is wrong with it (default: a chat conversation, `conversation`);
    `section` names the params in messages (the preference pairs have their own)."""

    where: str  # the file or Hub split, for messages
    column: str | None
    on_bad_row: str = "stop"
    max_skipped_fraction: float = 0.0
    format: str = "messages"
    parse: Callable[[object], tuple[dict | None, str | None]] | None = None
    section: str = "dataset"
    # Good rows left out all the same (stages/lib/decontamination.py): None, or why
    exclude: Callable[[dict], str | None] | None = None
    skipped: list[dict] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)
    kept: int = 0

    def rows(self, source, limit: int | None = None):
        """Yields the record of each good row of `source` ((row, value, problem) triples),
        up to `limit` good rows."""
        parse = self.parse or (lambda value: conversation(value, self.format, self.column))
        for row_no, value, bad in source:
            if limit is not None and self.kept >= limit:
                break
            record = None
            if bad is None:
                record, bad = parse(value)
            if bad:
                if self.on_bad_row == "stop":
                    raise UserError(f"{self.where}, row {row_no}: {bad}")
                self.skipped.append({"row": row_no, "reason": bad})
                continue
            why = self.exclude(record) if self.exclude else None
            if why:
                self.excluded.append({"row": row_no, "reason": why})
                continue
            self.kept += 1
            yield record
        self.check()

    def check(self) -> None:
        seen = self.kept + len(self.skipped) + len(self.excluded)
        if self.kept == 0 and self.excluded:  # (the rest, if any, bad rows skipped)
            raise UserError(
                f"{self.where}: every good row shares a run of words with a benchmark prompt "
                f"({self.excluded[0]['reason']}); check {self.section}.decontaminate"
            )
        if seen == 0:
            raise UserError(f"{self.where}: no rows; an empty split cannot be trained or evaluated on")
        if len(self.skipped) > self.max_skipped_fraction * seen:
            first = self.skipped[0]
            raise UserError(
                f"{self.where}: {len(self.skipped)} of {seen} rows are bad ({100 * len(self.skipped) / seen:.2g}%), "
                f"more than {self.section}.max_skipped_fraction={self.max_skipped_fraction:g}; "
                f"the first, row {first['row']}: {first['reason']}"
            )


def held_out(row_no: int, every: int) -> bool:
    """A package file's split: every `every`-th row (by its number in the file) is held out."""
    return row_no % every == 0


def split_rows(d: dict, split: str, section: str = "dataset"):
    """(where, rows) of one split of a data section (`dataset`, `preference.data`): rows are
    (row number, value, problem) triples, from <local_dir>/<split>.jsonl, the Hub, or a
    pinned package's file (one file: its rows split by `holdout_every`, `split` "train" or
    "eval")."""
    if d["source"] == "local":
        where = os.path.join(d["local_dir"], f"{split}.jsonl")
        return where, read_jsonl(where)
    if d["source"] == "package":
        path = package_data.locate(d["package"], f"{section}.package")
        every, want = d["holdout_every"], split == "eval"
        rows = ((n, value, bad) for n, value, bad in read_rows(path) if held_out(n, every) == want)
        return (
            f"{package_data.describe(d['package'])} ({split}: {'every' if want else 'all but every'} {every}th row)",
            rows,
        )
    from stages.lib import hub  # huggingface_hub: imported where a Hub source is read, not by every stage

    hub_rows = ((i, row, None) for i, row in enumerate(hub.load_dataset_split(d["repo_id"], d["revision"], split), 1))
    return f"{d['repo_id']} split {split}", hub_rows


def splits(d: dict) -> list[tuple[str, str, int | None]]:
    """(our name, the source's split, row limit) of the two splits a data stage writes (a
    package's one file is split by its rows' numbers: `split_rows`)."""
    if d["source"] == "package":
        return [("train", "train", d["max_train_rows"]), ("eval", "eval", d["max_eval_rows"])]
    return [("train", d["train_split"], d["max_train_rows"]), ("eval", d["eval_split"], d["max_eval_rows"])]
