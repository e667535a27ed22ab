"""What every family's tiny checkpoint is made of: weights drawn with numpy from a seed and
written in the Hub's sharded safetensors layout. No torch is needed. The family modules
(stages/shared/families/) say which tensors, config and tokenizer a tiny model has.
"""

import json
import os

from stages.shared import checkpoint

SHARD_BYTES = 32 * 1024 * 1024  # small shards, so the index/shard code path of real checkpoints runs


def random_weights(shapes: dict, seed: int, norm_center: float = 0.0) -> dict:
    """Deterministic bf16 weights, scaled like a trained model's rather than a fresh init's.

    A freshly initialised model has near-uniform next-token distributions, in which a wrong
    RoPE base, activation or norm convention barely moves the output, so an export check
    could not tell a broken conversion from a good one. Here logits have a spread of a few
    units (embedding std ~ 1/sqrt(hidden)), projections keep activations O(1) so the
    activation's curvature matters, and norm weights vary around `norm_center` (1 for a
    norm that multiplies by its weight, 0 for Gemma's `1 + weight`) so that a convention
    mixed up is visible.
    """
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if "norm" in name:
            weights[name] = (
                (norm_center + rng.normal(0.0, 0.1, size=shape)).astype(np.float32).astype(ml_dtypes.bfloat16)
            )
            continue
        if name.endswith(".bias"):
            std = 0.1
        elif "embed_tokens" in name:
            std = 1.0 / np.sqrt(shape[1])
        else:
            std = 1.0 / np.sqrt(np.prod(shape[1:]))  # fan-in scaling: unit-variance outputs
        weights[name] = rng.normal(0.0, std, size=shape).astype(np.float32).astype(ml_dtypes.bfloat16)
    return weights


def save_sharded(weights: dict, out_dir: str, shard_bytes: int = SHARD_BYTES) -> None:
    """model-0000i-of-0000n.safetensors plus model.safetensors.index.json, as the Hub stores them."""
    total = sum(w.nbytes for w in weights.values())
    weight_map = checkpoint.write_shards(((n, weights[n]) for n in sorted(weights)), out_dir, shard_bytes)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)


def write_checkpoint(
    out_dir: str, config: dict, generation: dict, shapes: dict, seed: int, norm_center: float = 0.0
) -> None:
    """config.json, generation_config.json and the weights of a tiny checkpoint."""
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({**generation, "do_sample": False}, f, indent=2)
    save_sharded(random_weights(shapes, seed, norm_center), out_dir)


def projection_shapes(layer: str, t: dict) -> dict[str, tuple[int, ...]]:
    """One decoder layer's attention and gated-MLP projections (HF names under `layer`)."""
    hidden, inter, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    q_dim, kv_dim = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd
    return {
        f"{layer}self_attn.q_proj.weight": (q_dim, hidden),
        f"{layer}self_attn.k_proj.weight": (kv_dim, hidden),
        f"{layer}self_attn.v_proj.weight": (kv_dim, hidden),
        f"{layer}self_attn.o_proj.weight": (hidden, q_dim),
        f"{layer}mlp.gate_proj.weight": (inter, hidden),
        f"{layer}mlp.up_proj.weight": (inter, hidden),
        f"{layer}mlp.down_proj.weight": (hidden, inter),
    }


def causal_lm_shapes(t: dict, qk_norm: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Llama-style `*ForCausalLM` checkpoint (Llama, Qwen), by its name."""
    hidden, hd = t["hidden_size"], t["head_dim"]
    shapes = {"model.embed_tokens.weight": (t["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not t["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (t["vocab_size"], hidden)
    for i in range(t["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        shapes[f"{layer}input_layernorm.weight"] = (hidden,)
        shapes[f"{layer}post_attention_layernorm.weight"] = (hidden,)
        if qk_norm:
            shapes[f"{layer}self_attn.q_norm.weight"] = (hd,)
            shapes[f"{layer}self_attn.k_norm.weight"] = (hd,)
        shapes.update(projection_shapes(layer, t))
    return shapes


def maxtext_asset(*parts: str) -> str:
    """A file the MaxText wheel ships (tokenizers, chat templates)."""
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), *parts)
