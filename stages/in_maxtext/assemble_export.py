"""Turning MaxText's Hugging Face export into a drop-in replacement for the base checkpoint.

`to_huggingface` writes the language model only (the vision tower is not part of text SFT),
in transformers' in-memory tensor names, in shards of up to 3 GB, with a config.json built
from its table. The published export instead has exactly the base checkpoint's files:
  - the base's config.json, tokenizer, chat template and generation config, verbatim
    (MaxText's config is only compared with it, field by field);
  - every tensor the base has, under the base's names: the fine-tuned language model from
    MaxText, everything else (vision tower, projector) unchanged from the base;
  - shards of `convert_out.shard_size_mb`, so remote transfers parallelise across files.
"""

import json
import os
import shutil

import ml_dtypes
import numpy as np
from safetensors import safe_open

from stages.shared import families
from stages.shared.checkpoint import rename, tensor_files, write_shards
from stages.shared.errors import StageFailed

WEIGHT_FILES = ("model.safetensors.index.json",)
# Config fields that describe the file, not the model; they may differ between exports.
VOLATILE = {"transformers_version", "dtype", "torch_dtype", "_name_or_path"}
NP_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def _normalised_config(model_dir: str) -> dict:
    import transformers

    d = transformers.AutoConfig.from_pretrained(model_dir).to_dict()

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
        return x

    return strip(d)


def config_differences(a_dir: str, b_dir: str) -> list[str]:
    """Fields (dotted) whose values differ between two checkpoints' configs."""

    def diff(a, b, prefix=""):
        if isinstance(a, dict) and isinstance(b, dict):
            out = []
            for k in sorted(set(a) | set(b)):
                out += diff(a.get(k), b.get(k), f"{prefix}{k}.")
            return out
        return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} vs {b!r}"]

    return diff(_normalised_config(a_dir), _normalised_config(b_dir))


def assemble(maxtext_dir: str, base_dir: str, out_dir: str, dtype: str, shard_bytes: int, model_name: str) -> dict:
    """Writes the export into out_dir; returns {tensor name: 'maxtext' | 'base'}."""
    differences = config_differences(maxtext_dir, base_dir)
    if differences:
        raise StageFailed(
            "MaxText exported a config that differs from the base checkpoint's: " + "; ".join(differences[:5])
        )

    layouts = families.of(model_name).LAYOUTS
    layout = layouts[families.detect_layout(base_dir, model_name)]
    base_files = tensor_files(base_dir)
    trained = {rename(n, layouts["transformers"], layout): (path, n) for n, path in tensor_files(maxtext_dir).items()}
    missing = sorted(set(trained) - set(base_files))
    if missing:
        raise StageFailed(f"MaxText exported tensors the base does not have, e.g. {missing[0]}")
    sources = {n: trained.get(n, (path, n)) for n, path in base_files.items()}

    target = NP_DTYPES[dtype]

    def tensors():
        for name in sorted(sources):
            path, key = sources[name]
            with safe_open(path, framework="np") as f:
                tensor = f.get_tensor(key)
            with safe_open(base_files[name], framework="np") as f:
                base_shape = f.get_slice(name).get_shape()
            if list(tensor.shape) != list(base_shape):
                raise StageFailed(
                    f"{name}: exported shape {list(tensor.shape)} differs from the base's {list(base_shape)}"
                )
            if np.issubdtype(tensor.dtype, np.floating) or tensor.dtype == ml_dtypes.bfloat16:
                tensor = tensor.astype(target)
            yield name, tensor

    weight_map = write_shards(tensors(), out_dir, shard_bytes)
    total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in set(weight_map.values()))
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)

    for entry in sorted(os.listdir(base_dir)):
        src = os.path.join(base_dir, entry)
        if os.path.isfile(src) and not entry.endswith(".safetensors") and entry not in WEIGHT_FILES:
            shutil.copyfile(src, os.path.join(out_dir, entry))
    _set_config_dtype(os.path.join(out_dir, "config.json"), dtype)
    return {n: "maxtext" if n in trained else "base" for n in sources}


def _set_config_dtype(path: str, dtype: str) -> None:
    with open(path) as f:
        config = json.load(f)
    key = "dtype" if "dtype" in config else "torch_dtype"
    if config.get(key) != dtype:
        config[key] = dtype
        with open(path, "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
