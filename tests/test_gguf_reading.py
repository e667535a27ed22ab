"""stages/lib/gguf_reading.py: inside `one_parse_per_file()`, transformers' reads of a GGUF
share one parse of it by gguf's reader; a changed file is parsed again; outside, nothing is
shared."""

import os

import gguf
import numpy as np
import pytest

from stages.lib.gguf_reading import one_parse_per_file


@pytest.fixture
def small_gguf(tmp_path) -> str:
    """A GGUF holding a Gemma 3 config, a 100-token vocabulary and one tensor."""
    path = str(tmp_path / "m.gguf")
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_block_count(1)
    writer.add_context_length(32)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(1)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}".encode() for i in range(100)])
    writer.add_tensor("token_embd.weight", np.zeros((100, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def parses(monkeypatch) -> list:
    """Every parse by gguf's reader, counted (its class, subclassed)."""
    made = []

    class Counted(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            made.append((path, mode))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    return made


def test_transformers_reads_share_one_parse_inside_and_not_outside(small_gguf, parses):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    counted = gguf.GGUFReader
    with one_parse_per_file():
        first = load_gguf_checkpoint(small_gguf, return_tensors=False)["config"]
        again = load_gguf_checkpoint(small_gguf, return_tensors=False)["config"]
        assert len(parses) == 1
        assert again == first and first["hidden_size"] == 8 and first["vocab_size"] == 100
    assert gguf.GGUFReader is counted  # gguf's own again
    load_gguf_checkpoint(small_gguf, return_tensors=False)
    assert len(parses) == 2


def test_a_file_changed_since_its_parse_is_parsed_again(small_gguf, parses):
    with one_parse_per_file():
        before = gguf.GGUFReader(small_gguf)
        stat = os.stat(small_gguf)
        os.utime(small_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # (as a rewrite would)
        assert gguf.GGUFReader(small_gguf) is not before
        assert gguf.GGUFReader(small_gguf, "r+") is not gguf.GGUFReader(small_gguf, "r+")  # writable: never shared
    assert len(parses) == 4


def test_the_shared_parse_reads_what_ggufs_own_reader_reads(small_gguf):
    """The reader made inside the block (its mapping as a plain ndarray) gives gguf's fields,
    parts and tensors, byte for byte."""
    stock = gguf.GGUFReader(small_gguf)
    with one_parse_per_file():
        shared = gguf.GGUFReader(small_gguf)
    assert type(shared.data) is np.ndarray and isinstance(stock.data, np.memmap)
    assert list(shared.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        other = shared.fields[name]
        assert (other.offset, other.data, other.types) == (field.offset, field.data, field.types)
        assert all(np.array_equal(a, b) for a, b in zip(other.parts, field.parts, strict=True))
    assert [t.name for t in shared.tensors] == [t.name for t in stock.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(shared.tensors, stock.tensors, strict=True))
