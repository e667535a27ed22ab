"""Folds a LoRA adapter trained by MaxText's SFT into the base weights: one full checkpoint.

Run by the train stage (through stages.in_maxtext.main, for MaxText's environment):

    python -m stages.in_maxtext.main stages.in_maxtext.merge_lora --setup '{...}' --request \
        '{"base": "models/base-maxtext/0/items", "adapter": "<step>/model_params", "scale": 2.0, "out": OUT}' --

With LoRA on, MaxText's SFT (Tunix) saves only the adapter, and MaxText's to_huggingface
cannot merge it into a base converted by to_maxtext (it drops the adapter silently). Qwix,
which MaxText's LoRA uses, computes y = x.W + (x.A).B.(alpha/rank) with A of shape
(prod(contracting dims), rank) and B of shape (rank, prod(other dims)); MaxText's kernels
put their contracting dims first, so the merged kernel is W + reshape(A @ B).(alpha/rank),
layer by layer (a scanned stack carries the layer on axis 1, in kernels and adapters alike).
The result is written in convert_in's layout, in float32, which every MaxText entry point
reads. convert_out's check then compares the export with MaxText running base + adapter
unmerged, so a wrong merge cannot pass.
"""

import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from stages.shared import contract

REQUEST = contract.MergeLora


def restore_numpy(path: str) -> dict:
    """An Orbax PyTree checkpoint as nested dicts of numpy arrays (whatever its sharding was)."""
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(path)
    tree = getattr(getattr(metadata, "item_metadata", None), "tree", metadata)
    return checkpointer.restore(
        path, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    )


def adapter_modules(node: dict, path: tuple = ()):
    """(path, A, B) for every module the adapter trained."""
    if "kernel_lora_a" in node:
        yield path, node["kernel_lora_a"]["value"], node["kernel_lora_b"]["value"]
        return
    for name, child in node.items():
        if isinstance(child, dict):
            yield from adapter_modules(child, path + (name,))


def merge(base: dict, adapter: dict, scale: float) -> int:
    """Adds the adapter's deltas to base's kernels in place; returns how many were merged."""
    params = base["params"]["params"]
    merged = 0
    for path, a, b in adapter_modules(adapter):
        node = params
        for name in path:
            node = node[name]
        kernel = node["kernel"].astype(np.float32)
        if a.ndim == 3:  # scanned: (in, layers, rank) and (rank, layers, out)
            for layer in range(a.shape[1]):
                kernel[:, layer] += (a[:, layer] @ b[:, layer]).reshape(kernel[:, layer].shape) * scale
        else:
            kernel += (a @ b).reshape(kernel.shape) * scale
        node["kernel"] = kernel
        merged += 1
    return merged


def run(request: contract.MergeLora, maxtext_flags: list[str], setup: contract.Setup) -> None:
    base, adapter = restore_numpy(request.base), restore_numpy(request.adapter)
    count = merge(base, adapter, request.scale)
    if count == 0:
        raise SystemExit(f"{request.adapter}: no LoRA parameters found")
    full = jax.tree.map(lambda x: np.asarray(x, dtype=np.float32), base)
    ocp.PyTreeCheckpointer().save(os.path.abspath(request.out), full)
    print(f"merge_lora: merged {count} adapted kernels (scale {request.scale}) into {request.out}", flush=True)
