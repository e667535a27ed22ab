"""A tiny Gemma 3 checkpoint in the Hugging Face Hub's layout, built offline from a seed.

It has the same files, tensor names, config format and tokenizer as `google/gemma-3-4b-it`
(multimodal `Gemma3ForConditionalGeneration`, `language_model.model.*` keys, sharded
safetensors with an index), only with tiny dimensions, so every code path the real model
takes through the pipeline is exercised on a laptop CPU. No torch is needed: weights are
drawn with numpy and written with safetensors.

    python -c "from stages.lib.tiny_gemma3 import build; build('/tmp/tiny', seed=0)"
"""

import json
import os

import ml_dtypes
import numpy as np
import safetensors.numpy

from stages.lib import gemma3

# The text tower's shape. Vocabulary and special tokens are the real Gemma 3 ones.
DEFAULT_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 8,  # 6 scanned (one 5-local+1-global pattern) + 2 remainder layers
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 64,  # shorter than the training rows, so local attention is exercised
}
# A tiny SigLIP tower: the pipeline trains text only, but the checkpoint keeps the real
# model's structure so an export can be a drop-in replacement for the base.
TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
SHARD_BYTES = 32 * 1024 * 1024  # small shards, so the index/shard code path of real checkpoints runs


def hub_config(text: dict, vision: dict) -> dict:
    """config.json in the Hub's format (old-style rope keys, as google/gemma-3-4b-it has it)."""
    patches_per_side = vision["image_size"] // vision["patch_size"]
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "eos_token_id": [1, 106],
        "image_token_index": 262144,
        "initializer_range": 0.02,
        "mm_tokens_per_image": patches_per_side**2,
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "vocab_size": 262208,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": text["head_dim"],
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "max_position_embeddings": 131072,
            **text,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "num_channels": 3,
            "vision_use_head": False,
            **vision,
        },
    }


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Gemma 3 multimodal checkpoint, by its Hub name."""
    t, v = config["text_config"], config["vision_config"]
    hidden, inter, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    q_dim, kv_dim = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd
    lm = gemma3.HUB_PREFIX["language_model"]
    shapes = {f"{lm}embed_tokens.weight": (t["vocab_size"], hidden), f"{lm}norm.weight": (hidden,)}
    for i in range(t["num_hidden_layers"]):
        layer = f"{lm}layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            shapes[f"{layer}{norm}.weight"] = (hidden,)
        shapes[f"{layer}self_attn.q_norm.weight"] = (hd,)
        shapes[f"{layer}self_attn.k_norm.weight"] = (hd,)
        shapes[f"{layer}self_attn.q_proj.weight"] = (q_dim, hidden)
        shapes[f"{layer}self_attn.k_proj.weight"] = (kv_dim, hidden)
        shapes[f"{layer}self_attn.v_proj.weight"] = (kv_dim, hidden)
        shapes[f"{layer}self_attn.o_proj.weight"] = (hidden, q_dim)
        shapes[f"{layer}mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{layer}mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{layer}mlp.down_proj.weight"] = (hidden, inter)

    vh, vi, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    vm = gemma3.HUB_PREFIX["vision_tower"] + "vision_model."
    shapes[f"{vm}embeddings.patch_embedding.weight"] = (vh, v["num_channels"], patch, patch)
    shapes[f"{vm}embeddings.patch_embedding.bias"] = (vh,)
    shapes[f"{vm}embeddings.position_embedding.weight"] = ((v["image_size"] // patch) ** 2, vh)
    for i in range(v["num_hidden_layers"]):
        layer = f"{vm}encoder.layers.{i}."
        for name, shape in (("layer_norm1", (vh,)), ("layer_norm2", (vh,))):
            shapes[f"{layer}{name}.weight"] = shape
            shapes[f"{layer}{name}.bias"] = shape
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{layer}self_attn.{proj}.weight"] = (vh, vh)
            shapes[f"{layer}self_attn.{proj}.bias"] = (vh,)
        shapes[f"{layer}mlp.fc1.weight"] = (vi, vh)
        shapes[f"{layer}mlp.fc1.bias"] = (vi,)
        shapes[f"{layer}mlp.fc2.weight"] = (vh, vi)
        shapes[f"{layer}mlp.fc2.bias"] = (vh,)
    shapes[f"{vm}post_layernorm.weight"] = (vh,)
    shapes[f"{vm}post_layernorm.bias"] = (vh,)
    mm = gemma3.HUB_PREFIX["multi_modal_projector"]
    shapes[f"{mm}mm_input_projection_weight"] = (vh, hidden)
    shapes[f"{mm}mm_soft_emb_norm.weight"] = (vh,)
    return shapes


def random_weights(shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """Deterministic bf16 weights, scaled like a trained model's rather than a fresh init's.

    A freshly initialised Gemma has near-uniform next-token distributions, in which a wrong
    RoPE base, activation or norm convention barely moves the output, so an export check
    could not tell a broken conversion from a good one. Here logits have a spread of a few
    units (embedding std ~ 4/sqrt(hidden)), projections keep activations O(1) so the GELU's
    curvature matters, and norm weights are non-zero so Gemma's `1 + weight` convention is
    visible.
    """
    rng = np.random.default_rng(seed)
    weights = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if "norm" in name or name.endswith(".bias"):
            std = 0.1
        elif "embed_tokens" in name:
            std = 1.0 / np.sqrt(shape[1])
        else:
            std = 1.0 / np.sqrt(np.prod(shape[1:]))  # fan-in scaling: unit-variance outputs
        weights[name] = rng.normal(0.0, std, size=shape).astype(np.float32).astype(ml_dtypes.bfloat16)
    return weights


def save_sharded(weights: dict[str, np.ndarray], out_dir: str, shard_bytes: int = SHARD_BYTES) -> None:
    """model-0000i-of-0000n.safetensors plus model.safetensors.index.json, as the Hub stores them."""
    shards, current, size = [], {}, 0
    for name in sorted(weights):
        nbytes = weights[name].nbytes
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = weights[name]
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(shard, os.path.join(out_dir, filename), metadata={"format": "pt"})
        weight_map.update({name: filename for name in shard})
    index = {"metadata": {"total_size": sum(w.nbytes for w in weights.values())}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)


def build(out_dir: str, seed: int, text: dict | None = None, vision: dict | None = None) -> None:
    """Writes a complete tiny HF checkpoint (config, weights, tokenizer, chat template) to out_dir."""
    config = hub_config({**DEFAULT_TEXT, **(text or {})}, {**TINY_VISION, **(vision or {})})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0, "do_sample": False}, f, indent=2)
    save_sharded(random_weights(tensor_shapes(config), seed), out_dir)
    gemma3.write_tokenizer(out_dir)
