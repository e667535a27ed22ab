"""Deliberate faults in a Hugging Face checkpoint, for calibrating the pipeline's gates
(bench/export_check_calibration.py, bench/conversion_check_calibration.py).

Each fault is a function of a checkpoint directory that rewrites it in place. The directory
is a copy made of hard links (cheap), so a file is replaced, never written through.
"""

import json
import os

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy: safetensors reads bf16 tensors through it)
import numpy as np
import safetensors.numpy

from stages.shared import families
from stages.shared.checkpoint import tensor_files


def _replace_json(path: str, data: dict) -> None:
    os.unlink(path)  # a hard link to the original: replace, never write through
    with open(path, "w") as f:
        json.dump(data, f)


def edit_config(**text_changes):
    """Changes fields of the (text) config."""

    def apply(d):
        path = os.path.join(d, "config.json")
        with open(path) as f:
            config = json.load(f)
        config.get("text_config", config).update(text_changes)
        _replace_json(path, config)

    return apply


def rewrite_tensors(d: str, change) -> None:
    """`change(tensors)` edits {name: float32 array} in place and returns the names it changed;
    the files holding them are rewritten, each tensor in its own dtype."""
    files = tensor_files(d)
    loaded = {path: safetensors.numpy.load_file(path) for path in set(files.values())}
    tensors = {name: loaded[files[name]][name].astype(np.float32) for name in files}
    changed = change(tensors)
    for path in {files[name] for name in changed}:
        out = {name: tensors[name].astype(loaded[path][name].dtype) for name in loaded[path]}
        os.unlink(path)
        safetensors.numpy.save_file(out, path, metadata={"format": "pt"})


def edit_tensor(suffix: str, fn):
    """Applies fn to the one tensor whose name ends with suffix."""

    def apply(d):
        def change(tensors):
            name = next(n for n in tensors if n.endswith(suffix))
            tensors[name] = fn(tensors[name])
            return {name}

        rewrite_tensors(d, change)

    return apply


def swap_tensors(suffix_a: str, suffix_b: str):
    """Exchanges two tensors of one shape (e.g. a layer's two feed-forward norms)."""

    def apply(d):
        def change(tensors):
            a = next(n for n in tensors if n.endswith(suffix_a))
            b = next(n for n in tensors if n.endswith(suffix_b))
            tensors[a], tensors[b] = tensors[b], tensors[a]
            return {a, b}

        rewrite_tensors(d, change)

    return apply


def swap_layers(a: int, b: int, model_name: str):
    """Exchanges every tensor of two decoder layers, in whichever layout the checkpoint uses."""

    def apply(d):
        family = families.of(model_name)
        prefix = family.LAYOUTS[families.detect_layout(d, model_name)]["language_model"] + "layers."

        def change(tensors):
            changed = set()
            for n in list(tensors):
                if n.startswith(f"{prefix}{a}."):
                    m = n.replace(f"{prefix}{a}.", f"{prefix}{b}.", 1)
                    tensors[n], tensors[m] = tensors[m], tensors[n]
                    changed |= {n, m}
            return changed

        rewrite_tensors(d, change)

    return apply


def reverse_heads(suffix: str, head_dim: int):
    """Reverses the order of a projection's attention heads."""
    return edit_tensor(suffix, lambda w: w.reshape(-1, head_dim, w.shape[1])[::-1].reshape(w.shape))
