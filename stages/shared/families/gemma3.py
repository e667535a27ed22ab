"""Gemma 3 (`gemma3-4b`, `gemma3-12b`, `gemma3-27b`): the multimodal checkpoints the Hub has
(`Gemma3ForConditionalGeneration`), of which the pipeline trains the language model, and the
text-only ones (`Gemma3ForCausalLM`, `gemma3_text`: gemma-3-270m and gemma-3-1b and their -it
variants), trained and exported as they are, with no vision tower.

MaxText's converters describe a model by a hard-coded Hugging Face config keyed by
`model_name` (`HF_MODEL_CONFIGS`), not by the checkpoint's own `config.json`; the pipeline
replaces that entry with the checkpoint's (stages/in_maxtext/main.py). Its gemma3-4b entry
has exact-erf `gelu` and `rope_theta=10000` while MaxText trains with tanh-GELU and 1e6: with
the checkpoint's own config a shrunken model, a changed vocabulary or such a mistake all
convert faithfully. The traps checked below: MaxText hard-codes Gemma 3's 5-local/1-global
attention pattern, tanh-GELU, no soft-capping, and the query scaling of each size.

The tiny model has the same files, tensor names, config format and tokenizer as
`google/gemma-3-4b-it` (multimodal, `language_model.model.*` keys, sharded safetensors),
only tiny dimensions:

    python -c "from stages.shared.families import gemma3; gemma3.build_tiny('/tmp/tiny', seed=0)"
"""

import functools
import json
import os
import shutil
import tempfile

from stages.shared import tiny
from stages.shared.families import dimension_args, problems_in, refuse, rounded

NAME = "Gemma 3"
MAXTEXT_NAMES = ("gemma3-4b", "gemma3-12b", "gemma3-27b")
PIPELINE_TAG = "image-text-to-text"  # the Hub's task for the model card (text-only checkpoints: text-generation)
END_OF_TURN = "<end_of_turn>"  # ends each turn (token 106: added, not marked special): where an answer ends
TINY = "Gemma 3 architecture, 8 layers, hidden 128; Gemma 3's own tokenizer and chat template (shipped with MaxText)"

# Where each tower lives in the two layouts Gemma 3 checkpoints come in. MaxText's parameter
# mapping names tensors the way transformers >= 4.52 holds them in memory; the Hub's
# google/gemma-3-*-it files (and save_pretrained) use the older names.
LAYOUTS = {
    "transformers": {
        "language_model": "model.language_model.",
        "vision_tower": "model.vision_tower.",
        "multi_modal_projector": "model.multi_modal_projector.",
    },
    "hub": {
        "language_model": "language_model.model.",
        "vision_tower": "vision_tower.",
        "multi_modal_projector": "multi_modal_projector.",
    },
    # Text-only checkpoints: the language model alone. Last, since its prefix also starts
    # the transformers layout's names (checkpoint.detect_layout takes the first that fits).
    "text": {"language_model": "model."},
}
HUB_PREFIX = LAYOUTS["hub"]

# MaxText hard-codes Gemma 3's attention pattern: five sliding-window layers, then one global.
ATTENTION_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]

MODEL_TYPE = "gemma3_text"  # of text_config (or of the whole config, for a text-only checkpoint)
GGUF_ARCHITECTURE = "gemma3"  # general.architecture of a llama.cpp GGUF of it (base_model.source gguf, export_gguf)
GGUF_TOKENIZER = ("llama", None)  # SentencePiece, as llama.cpp reads it
GGUF_CONTROL = ("<start_of_turn>", "<end_of_turn>")  # control tokens in a GGUF, as Google's tokenizer marks them
CONFIG_FIELDS = (
    "tie_word_embeddings",
    "hidden_activation",
    "query_pre_attn_scalar",
    "head_dim",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "sliding_window",
    "rms_norm_eps",
    "layer_types",
    "rope_parameters",
    "final_logit_softcapping",
    "attn_logit_softcapping",
)


def model_args(t, model_name: str) -> list[str]:
    expected_scalar = (
        t.head_dim if model_name in ("gemma3-4b", "gemma3-12b") else t.hidden_size // t.num_attention_heads
    )
    problems = problems_in(
        t,
        {
            "hidden_activation": ("gelu_pytorch_tanh", "MaxText's Gemma 3 uses tanh-GELU"),
            "query_pre_attn_scalar": (
                expected_scalar,
                f"MaxText's {model_name} scales queries by {expected_scalar}**-0.5",
            ),
        },
    )
    pattern = [ATTENTION_PATTERN[i % 6] for i in range(t.num_hidden_layers)]
    if list(t.layer_types) != pattern:
        problems.append("layer_types is not Gemma 3's 5-local/1-global pattern")
    if t.tie_word_embeddings is False:
        problems.append("tie_word_embeddings=False (MaxText's Gemma 3 computes logits with the embedding)")
    if t.final_logit_softcapping or t.attn_logit_softcapping:
        problems.append("logit soft-capping is set (Gemma 3 has none)")
    rope = t.rope_parameters
    full, local = rope["full_attention"], rope["sliding_attention"]
    if local.get("rope_type", "default") != "default" or full.get("rope_type") not in ("default", "linear"):
        problems.append(f"rope_parameters={rope} (MaxText supports linear scaling of global layers only)")
    refuse(problems)
    return [
        *dimension_args(t, model_name),
        f"sliding_window_size={t.sliding_window}",
        f"rope_max_timescale={int(full['rope_theta'])}",
        f"local_rope_max_timescale={int(local['rope_theta'])}",
        f"rope_linear_scaling_factor={float(full.get('factor', 1.0))}",
    ]


# MaxText's Gemma 3 tables (its parameter mapping, hooks and HF shapes) read
# config["text_config"] and config["vision_config"]: a text-only config is handed to them as
# the text config of a model without vision layers (stages/in_maxtext/main.py).
NO_VISION = {
    "hidden_size": 0,
    "intermediate_size": 0,
    "num_hidden_layers": 0,
    "patch_size": 1,
    "num_channels": 0,
    "image_size": 0,
}


def converter_config(config: dict) -> dict:
    """The config dict MaxText's Gemma 3 tables expect, from a checkpoint's config.to_dict()."""
    if "text_config" in config:
        return config
    return {**config, "text_config": config, "vision_config": NO_VISION}


def like_maxtext(model):
    """Gives a transformers Gemma 3 MaxText's embedding arithmetic; returns MaxText's output
    head, for the gates to compare like with like (stages/in_maxtext/logit_check.py):
      - MaxText holds the embedding pre-multiplied by bf16(sqrt(hidden)) (the converter's
        hook), so its input scale is that bf16 value (25.25 for hidden 640), as Google's bf16
        reference and transformers in bf16 have it; transformers in float32 uses the exact 25.298;
      - its logits are that pre-scaled table, cast to bf16 in the dot whatever `dtype` says
        (maxtext/layers/embeddings.py, attend_on_embedding, MaxText 0.2.5), then divided by the
        exact sqrt(hidden) (`normalize_embedding_logits`).
    On the real Gemma 3 270M the head alone is most of what parts the two libraries (max KL
    4.4e-3 against float32 noise; docs/benchmarks.md), so a gate that ignored it would sit
    a thousandfold above a faithful conversion. The returned head maps the final (normed)
    hidden states to logits."""
    import ml_dtypes
    import torch

    embed = model.get_input_embeddings()
    hidden = embed.weight.shape[1]
    folded = float(ml_dtypes.bfloat16(hidden**0.5))
    embed.embed_scale.fill_(folded)
    table = (embed.weight.detach() * folded).to(torch.bfloat16).to(torch.float32)
    return lambda h: (h @ table.T) / hidden**0.5


def export_rounding(path: tuple[str, ...], value, dtype: str, hf_config):
    """MaxText's Gemma 3 mapping (param_mapping's hooks) exports the embedding divided by
    bf16(sqrt(hidden)) and every RMSNorm scale minus 1 (Gemma's 1+w); the rest unchanged;
    then stages/in_maxtext/assemble_export.py rounds each tensor to `dtype` once."""
    import ml_dtypes
    import numpy as np

    if dtype == "float32":
        return value
    if path[-1] == "embedding" and "token_embedder" in path:
        normalizer = np.float32(ml_dtypes.bfloat16(getattr(hf_config, "text_config", hf_config).hidden_size ** 0.5))
        # XLA (to_huggingface runs on CPU) divides by a constant as a multiply by its reciprocal.
        return rounded(value * (np.float32(1) / normalizer), dtype) * normalizer
    if path[-1] == "scale" and len(path) > 1 and path[-2].endswith("norm"):
        return rounded(value - np.float32(1), dtype) + np.float32(1)
    return rounded(value, dtype)


# The tiny model's text tower. Vocabulary and special tokens are the real Gemma 3 ones.
TINY_TEXT = {
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
    hidden, hd = t["hidden_size"], t["head_dim"]
    lm = HUB_PREFIX["language_model"]
    shapes = {f"{lm}embed_tokens.weight": (t["vocab_size"], hidden), f"{lm}norm.weight": (hidden,)}
    for i in range(t["num_hidden_layers"]):
        layer = f"{lm}layers.{i}."
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            shapes[f"{layer}{norm}.weight"] = (hidden,)
        shapes[f"{layer}self_attn.q_norm.weight"] = (hd,)
        shapes[f"{layer}self_attn.k_norm.weight"] = (hd,)
        shapes.update(tiny.projection_shapes(layer, t))

    vh, vi, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    vm = HUB_PREFIX["vision_tower"] + "vision_model."
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
    mm = HUB_PREFIX["multi_modal_projector"]
    shapes[f"{mm}mm_input_projection_weight"] = (vh, hidden)
    shapes[f"{mm}mm_soft_emb_norm.weight"] = (vh,)
    return shapes


# Gemma 3's generation config as the Hub has it: a turn ends at <end_of_turn> (106) or <eos> (1).
GENERATION = {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}


def build_tiny(out_dir: str, seed: int, text: dict | None = None, vision: dict | None = None) -> None:
    """Writes a complete tiny HF checkpoint (config, weights, tokenizer, chat template) to out_dir."""
    config = hub_config({**TINY_TEXT, **(text or {})}, {**TINY_VISION, **(vision or {})})
    tiny.write_checkpoint(out_dir, config, GENERATION, tensor_shapes(config), seed)
    write_tokenizer(out_dir)


def write_gguf_companions(out_dir: str) -> None:
    """What a dequantized GGUF (stages/lib/gguf_source.py) lacks beside weights and config:
    Gemma 3's tokenizer with its chat template (the GGUF's vocabulary gives the same ids but
    has no template), and the generation config that ends a turn at <end_of_turn>."""
    write_tokenizer(out_dir)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(GENERATION, f, indent=2)


def tokenizer_file() -> str:
    return tiny.maxtext_asset("assets", "tokenizers", "tokenizer.gemma3")


def chat_template() -> str:
    """Gemma 3's chat template, as MaxText ships it (identical across Gemma 3 sizes)."""
    with open(tiny.maxtext_asset("examples", "chat_templates", "gemma-3-27b-chat_template.json")) as f:
        return json.load(f)["chat_template"]


@functools.lru_cache(maxsize=1)
def _tokenizer_files() -> dict[str, bytes]:
    """The HF tokenizer files, built once per process (converting the SentencePiece model
    takes seconds; they are the same bytes every time)."""
    import transformers

    with tempfile.TemporaryDirectory() as spm_dir, tempfile.TemporaryDirectory() as out_dir:
        shutil.copy(tokenizer_file(), os.path.join(spm_dir, "tokenizer.model"))
        tokenizer = transformers.GemmaTokenizer.from_pretrained(spm_dir)
        tokenizer.init_kwargs.pop("vocab_file", None)  # a temporary path: would make the files differ per build
        tokenizer.chat_template = chat_template()
        tokenizer.save_pretrained(out_dir)
        shutil.copy(tokenizer_file(), os.path.join(out_dir, "tokenizer.model"))
        return {name: open(os.path.join(out_dir, name), "rb").read() for name in sorted(os.listdir(out_dir))}


def write_tokenizer(out_dir: str) -> None:
    """The real Gemma 3 tokenizer (SentencePiece model shipped in the MaxText wheel) as HF files."""
    for name, content in _tokenizer_files().items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(content)


def gguf_tensor(name: str, value, config):
    """A language-model tensor as llama.cpp's Gemma 3 holds it: its RMS norms multiply by w
    where transformers' multiply by 1 + w, so the GGUF stores 1 + w (llama.cpp's converter
    does the same; transformers' GGUF reader subtracts the 1 again)."""
    return value + 1 if name.endswith("norm.weight") else value


def gguf_metadata(writer, config) -> dict:
    """Gemma 3's keys beyond the common ones: its global layers' RoPE base and scaling, the
    local layers' window (llama.cpp knows the 5-local-1-global pattern and the local base
    of 10,000 by the architecture). No extra tensors."""
    import gguf

    full = config.rope_parameters["full_attention"]
    writer.add_rope_freq_base(float(full["rope_theta"]))
    if full.get("rope_type", "default") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(full["factor"]))
    writer.add_sliding_window(config.sliding_window)
    # Gemma's SentencePiece adds no space before a text and its BOS is the template's: without
    # these, llama.cpp reads a SentencePiece vocabulary as Llama's (a space before every prompt),
    # which only a reader of the whole file sees (found by the GGUF check's llama.cpp reading;
    # Google's own GGUF of the 270M sets the same three).
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    return {}


# Ollama's template for Gemma 3 (Go text/template): each turn between <start_of_turn> and
# <end_of_turn>, a system prompt folded into the first user turn, as the Jinja template does.
OLLAMA_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if or (eq .Role "user") (eq .Role "system") }}<start_of_turn>user
{{ .Content }}<end_of_turn>
{{ if $last }}<start_of_turn>model
{{ end }}
{{- else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- end }}"""
