"""One parse of a GGUF file for all of transformers' reads of it within a check.

transformers reads a GGUF through gguf's own `GGUFReader`, and parses the file again for each
read: `from_pretrained(..., gguf_file=...)` once for the config and once for the tensors (or,
for a tokenizer, its vocabulary), each through `load_gguf_checkpoint`. The reader's
constructor walks every metadata field element by element, and a vocabulary is three fields
of one element per token: for Gemma 3's 262,144 tokens 1.57 million numpy views, 14 s a parse
on a 2-core machine (measured 2026-12-06, the real 270M's Q8_0 file; the tensors themselves
are memory-mapped, not read). The export's check read each first file three times, the base
model's dequantization twice.

`one_parse_per_file()` hands every reader asked for inside it, for a file unchanged since
(same inode, size and modification time), the reader made for it first: still gguf's reader
and transformers' own mapping, an independent check of the project's writer, each file parsed
once. Read-only readers only (mode "r"); outside the block, gguf's reader is gguf's again.
transformers (5.24, pinned) imports the class from the package at each call (`from gguf import
GGUFReader` inside `load_gguf_checkpoint`): that name is what this replaces for the block's time.

That one parse is also 3x faster (13.1 -> 4.1 s, the tiny model's Q8_0 file, 2026-12-07): the
reader maps the file as an `np.memmap`, and each of those views pays numpy's memmap subclass
(its `__getitem__` and `__array_finalize__`, two thirds of the parse). The reader made here
holds the same mapping as a plain ndarray (`memmap.view(np.ndarray)`: the same pages, nothing
read or copied), so its views are plain ones; gguf's parsing code is unchanged and gives the
same fields, parts and tensors (tests/test_gguf_reading.py compares them).
"""

import contextlib
import os

import numpy as np


@contextlib.contextmanager
def one_parse_per_file():
    import gguf

    stock = gguf.GGUFReader
    parsed = {}

    class PlainViews(stock):
        """gguf's reader, its mapping held as a plain ndarray (the docstring above)."""

        @property
        def data(self):
            return self._mapped

        @data.setter
        def data(self, value):
            self._mapped = value.view(np.ndarray)  # (gguf's np.memmap; the same pages)

    def reader(path, mode="r"):
        if mode != "r":
            return stock(path, mode)
        found = os.stat(path)
        key = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
        if key not in parsed:
            parsed[key] = PlainViews(path, mode)
        return parsed[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = stock
