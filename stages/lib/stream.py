"""The order MaxText trains in, owned by the train stage so that a resumed run continues it.

MaxText's SFT input pipeline restarts from its first row when a run resumes (Tunix's data
hooks skip nothing), and its own shuffle would reshuffle. So the train stage hands MaxText
one file, the stream: every training row, shuffled with train.seed, once per epoch (each
epoch its own permutation), with MaxText's shuffling off. A resumed run gets the stream
from the first row the finished steps did not consume (stages/in_maxtext/data_position.py counts
them by replaying MaxText's own pipeline).

With train.packing, each epoch's shuffled order is also arranged, a window of rows at a
time, so that MaxText's packer fills its rows (`packed_order`): grain's PackAndBatch packs
online, first fit, and closes a batch at the first row that fits nowhere in it, so on
UltraChat's lengths (median ~1,100 tokens at max length 2048) the shuffled order alone leaves
~14% of every batch as padding. No row is added, dropped or cut; each is still trained once
per epoch, and the order is still a function of train.seed (and the lengths).

Both are written without holding the rows in memory: an index of line offsets (8 bytes a
row) is all that is kept, so UltraChat's 207,865 conversations cost ~2 MB, not ~1 GB.
"""

import bisect
import os
from dataclasses import dataclass

import numpy as np

from stages.lib import hardware


@dataclass(frozen=True)
class Packing:
    """What MaxText's packer does with the stream: `batch_rows` rows of `max_length` tokens
    per batch (per host: per-device batch x local devices), rows of `lengths[i]` tokens (cut
    to max_length), arranged `window` rows at a time (0: not arranged)."""

    lengths: np.ndarray
    batch_rows: int
    max_length: int
    window: int


def packing_for(params: dict, lengths: np.ndarray) -> Packing | None:
    """How MaxText will pack the stream for this recipe (None: it does not pack, or
    train.pack_window is 0). A host's batch is per-device batch x its devices (Tunix takes
    gradient accumulation's micro-batches one at a time)."""
    t = params["train"]
    if not t["packing"] or t["pack_window"] == 0:
        return None
    return Packing(
        lengths,
        t["per_device_batch_size"] * hardware.devices_per_host(params),
        t["max_target_length"],
        t["pack_window"],
    )


def line_offsets(path: str) -> np.ndarray:
    """Byte offset of every non-blank line of a JSONL file."""
    offsets = []
    with open(path, "rb") as f:
        pos = 0
        for line in f:
            if line.strip():
                offsets.append(pos)
            pos += len(line)
    return np.asarray(offsets, dtype=np.int64)


def epoch_orders(rows: int, seed: int, epochs: int):
    """Each epoch's row indices in training order: a permutation seeded with seed + epoch."""
    for epoch in range(epochs):
        yield np.random.RandomState(seed + epoch).permutation(rows)


def order(rows: int, seed: int, epochs: int):
    """Row indices in training order, every epoch after the other."""
    for permutation in epoch_orders(rows, seed, epochs):
        yield from permutation


def rows_of_batches(rows: list[int], lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """The rows (row indices) packed into rows of `capacity` tokens, best fit decreasing:
    longest first, each into the fullest row it still fits in."""
    packed: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, packed row), sorted
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        length = int(lengths[row])
        k = bisect.bisect_left(room, (length, -1))
        if k == len(room):
            packed.append([row])
            target, free = len(packed) - 1, capacity - length
        else:
            free, target = room.pop(k)
            packed[target].append(row)
            free -= length
        bisect.insort(room, (free, target))
    return packed


def packed_order(epochs, packing: Packing):
    """The rows of each epoch (an iterable of row indices per epoch), arranged so that grain's
    first-fit packer fills its batches. Each `window` rows of the shuffled order (plus those
    the previous window left over) are packed best-fit-decreasing into rows of max_length
    tokens; whole batches of those rows are emitted, oldest row first, each row's longest
    conversation first, and the rows of an incomplete last batch go on to the next window.
    Fed in that order, grain's packer puts each conversation into a row where it fits without
    closing the batch early (a planned row's conversations fit in it, and an earlier row only
    takes one that fits there too), so it packs batches nearly as full as the plan. A row
    moves by at most about two windows (it is carried over once); epochs are arranged one after the other (a row never
    leaves its epoch)."""
    lengths = np.minimum(packing.lengths, packing.max_length)
    per_batch = packing.batch_rows
    for rows in epochs:
        rows = list(rows)
        position = {row: i for i, row in enumerate(rows)}
        carried: list[int] = []
        for start in range(0, len(rows), packing.window):
            last = start + packing.window >= len(rows)
            planned = rows_of_batches(carried + rows[start : start + packing.window], lengths, packing.max_length)
            # Oldest first, so what is carried over goes out with the next window.
            planned.sort(key=lambda packed: min(position[r] for r in packed))
            whole = len(planned) if last else len(planned) // per_batch * per_batch
            for packed in planned[:whole]:  # batch after batch, row after row
                yield from packed
            carried = [r for packed in planned[whole:] for r in packed]


def host_orders(rows: int, seed: int, epochs: int, hosts: int, host: int):
    """Host `host`'s share of each epoch's order: every `hosts`-th row of it. MaxText's input
    pipeline gives each process of a job its own file (one shard each), and a step's global
    batch is the processes' rows side by side, so with packing off a job of H processes trains
    on the same batches, row for row, as one process with H devices reading the whole order."""
    for permutation in epoch_orders(rows, seed, epochs):
        yield permutation[host::hosts]


def stream_order(rows: int, seed: int, epochs: int, packing: Packing | None = None, hosts: int = 1, host: int = 0):
    """Row indices of host `host`'s stream (of a job of `hosts` processes), every epoch: the
    seeded order, arranged for MaxText's packer where `packing` says so."""
    if packing is not None and packing.window > 0:
        if len(packing.lengths) != rows:
            raise ValueError(f"{len(packing.lengths)} lengths for {rows} rows")
        return packed_order(host_orders(rows, seed, epochs, hosts, host), packing)
    return (i for permutation in host_orders(rows, seed, epochs, hosts, host) for i in permutation)


def first_fit_batches(order, lengths: np.ndarray, batch_rows: int, max_length: int) -> int:
    """How many batches grain's PackAndBatchOperation (as MaxText's SFT pipeline runs it) makes
    of rows in this order: each row, cut to max_length, into the first of the batch's rows
    with room for it; a row that fits in none closes the batch; the last, partial, counts."""
    batches, free = 0, []
    for i in order:
        n = min(int(lengths[i]), max_length)
        row = next((r for r, room in enumerate(free) if n <= room), None)
        if row is None:
            batches, free = batches + 1, [max_length] * batch_rows
            row = 0
        free[row] -= n
    return batches


def steps_fed(params: dict, lengths: np.ndarray) -> int:
    """How many training steps the recipe's stream of rows of these token lengths feeds, every
    epoch (what write() writes: the same order, and packing as MaxText packs it), each step
    taking gradient-accumulation micro-batches of per-device batch x devices rows on every
    host: the host whose stream runs out first ends the job."""
    t = params["train"]
    batch_rows = t["per_device_batch_size"] * hardware.devices_per_host(params)
    hosts = hardware.hosts(params)
    fed = []
    for host in range(hosts):
        order = stream_order(len(lengths), t["seed"], t["num_epochs"], packing_for(params, lengths), hosts, host)
        if t["packing"]:
            batches = first_fit_batches(order, lengths, batch_rows, t["max_target_length"])
        else:
            batches = sum(1 for _ in order) // batch_rows  # MaxText drops an incomplete last batch
        fed.append(batches // t["gradient_accumulation_steps"])
    return min(fed)


def write(
    train_jsonl: str, out: str, seed: int, epochs: int, packing: Packing | None = None, hosts: int = 1, host: int = 0
) -> int:
    """Writes the stream (host `host`'s of a job of `hosts` processes) to `out`, atomically;
    returns its number of rows. With `packing`, each epoch is arranged for MaxText's packer
    (packed_order), with the host's own batch."""
    offsets = line_offsets(train_jsonl)
    tmp = f"{out}.tmp-{os.getpid()}"
    count = 0
    rows = stream_order(len(offsets), seed, epochs, packing, hosts, host)
    with open(train_jsonl, "rb") as src, open(tmp, "wb") as dst:
        for i in rows:
            src.seek(offsets[i])
            line = src.readline()
            dst.write(line if line.endswith(b"\n") else line + b"\n")
            count += 1
    os.replace(tmp, out)
    return count


def skip(stream: str, consumed: int, out: str) -> int:
    """Writes the stream after its first `consumed` rows to `out`; returns the rows left."""
    tmp = f"{out}.tmp-{os.getpid()}"
    left = 0
    with open(stream, "rb") as src, open(tmp, "wb") as dst:
        for i, line in enumerate(src):
            if i >= consumed:
                dst.write(line)
                left += 1
    os.replace(tmp, out)
    return left
