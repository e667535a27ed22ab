"""A Hugging Face checkpoint on disk, whatever its model family: its config, tensor names,
size and tensor-name layout. What differs between families is in stages/shared/families/.
"""

import hashlib
import importlib.metadata
import json
import math
import os
import struct
from types import SimpleNamespace

from stages.shared.errors import UserError

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
CONFIG_CACHE = os.path.join(".cache", "checkpoint-configs")


class CheckpointError(UserError):
    """The base checkpoint is missing, unreadable, or not one MaxText can represent."""


def read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found; run the base_model stage first (dvc repro base_model)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def tensor_files(model_dir: str) -> dict[str, str]:
    """Tensor name -> the safetensors file holding it (sharded with an index, or a single file)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(model_dir, v) for k, v in json.load(f)["weight_map"].items()}
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return dict.fromkeys(safetensors_header(single), single)
    raise CheckpointError(f"{model_dir}: no model.safetensors.index.json or model.safetensors; is it a HF checkpoint?")


def safetensors_header(path: str) -> dict[str, dict]:
    """Tensor name -> {dtype, shape, data_offsets} from a safetensors file's header: its first 8
    bytes (the header's length) and the JSON after them. Nothing else of the file is read."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); re-run the base_model stage") from None
    header.pop("__metadata__", None)
    return header


def parameter_count(model_dir: str) -> int:
    """Number of weights in a safetensors checkpoint (from the file headers, nothing loaded)."""
    total = 0
    for path in sorted(set(tensor_files(model_dir).values())):
        if not os.path.exists(path):
            raise CheckpointError(
                f"{path}: missing (named by model.safetensors.index.json); re-run the base_model stage"
            )
        total += sum(math.prod(t["shape"]) for t in safetensors_header(path).values())
    return total


def write_shards(tensors, out_dir: str, shard_bytes: int) -> dict[str, str]:
    """Writes (name, array) pairs, in order, as model-0000i-of-0000n.safetensors files of up
    to shard_bytes each (the Hub's layout); returns the index's weight_map."""
    import safetensors.numpy

    shards, current, size = [], {}, 0
    for name, tensor in tensors:
        if current and size + tensor.nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += tensor.nbytes
    if current:
        shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(shard, os.path.join(out_dir, filename), metadata={"format": "pt"})
        weight_map.update({name: filename for name in shard})
        shard.clear()
    return weight_map


def detect_layout(model_dir: str, layouts: dict[str, dict[str, str]], family: str) -> str:
    """Which of a family's tensor-name layouts ({layout: {tower: prefix}}) the checkpoint uses."""
    read_config(model_dir)  # a checkpoint without a readable config.json fails here, first
    names = tensor_files(model_dir)
    for layout, prefix in layouts.items():
        if any(n.startswith(prefix["language_model"]) for n in names):
            return layout
    expected = " or ".join(f"'{p['language_model']}'" for p in layouts.values())
    raise CheckpointError(f"{model_dir}: no {family} language-model tensors (expected names starting with {expected})")


def rename(name: str, src: dict, dst: dict) -> str:
    """A tensor name moved from one layout ({tower: prefix}) to another; unchanged when the
    other layout has no such tower (a text-only checkpoint has no vision tower)."""
    for tower, prefix in src.items():
        if name.startswith(prefix):
            return dst[tower] + name[len(prefix) :] if tower in dst else name
    return name


def text_config(model_dir: str, fields: tuple[str, ...]) -> SimpleNamespace:
    """The checkpoint's text config as transformers normalises it (defaults filled in, rope
    parameters in today's form), cached under .cache/ by the bytes of config.json, the
    fields asked for and the transformers version: loading it takes ~4 s (transformers
    imports torch for its rope code) and every stage reads it."""
    path = os.path.join(model_dir, "config.json")
    read_config(model_dir)  # a missing or broken config.json fails here, with one line
    with open(path, "rb") as f:
        content = f.read()
    key = hashlib.sha256(content + ",".join(fields).encode() + importlib.metadata.version("transformers").encode())
    cached = os.path.join(CONFIG_CACHE, f"{key.hexdigest()[:24]}.json")
    try:
        with open(cached) as f:
            return SimpleNamespace(**json.load(f))
    except (OSError, json.JSONDecodeError):
        pass
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError) as e:  # an unknown model_type, a malformed field
        raise CheckpointError(f"{path}: transformers cannot read it ({str(e).splitlines()[0][:200]})") from None
    text = getattr(config, "text_config", config)
    values = json.loads(json.dumps({f: getattr(text, f, None) for f in fields}))
    os.makedirs(CONFIG_CACHE, exist_ok=True)
    tmp = f"{cached}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(values, f)
    os.replace(tmp, cached)
    return SimpleNamespace(**values)
