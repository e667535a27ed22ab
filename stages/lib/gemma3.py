"""Gemma 3 checkpoints as MaxText sees them: architecture flags, key layouts, tokenizer.

MaxText's converters describe a model by a hard-coded Hugging Face config keyed by
`model_name` (`HF_MODEL_CONFIGS`), not by the checkpoint's own `config.json`. Everything
here derives MaxText's view from the checkpoint instead, so a shrunken model, a changed
vocabulary or a config MaxText's table gets wrong (its gemma3-4b entry has exact-erf `gelu`
and `rope_theta=10000`, while MaxText trains with tanh-GELU and 1e6) all convert faithfully.
"""

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from types import SimpleNamespace

from stages.lib.cli import UserError

# Where each tower lives in the two layouts Gemma 3 checkpoints come in. MaxText's parameter
# mapping names tensors the way transformers >= 4.52 holds them in memory; the Hub's
# google/gemma-3-*-it files (and save_pretrained) use the older names.
TRANSFORMERS_PREFIX = {
    "language_model": "model.language_model.",
    "vision_tower": "model.vision_tower.",
    "multi_modal_projector": "model.multi_modal_projector.",
}
HUB_PREFIX = {
    "language_model": "language_model.model.",
    "vision_tower": "vision_tower.",
    "multi_modal_projector": "multi_modal_projector.",
}
LAYOUTS = {"transformers": TRANSFORMERS_PREFIX, "hub": HUB_PREFIX}

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}

# MaxText hard-codes Gemma 3's attention pattern: five sliding-window layers, then one global.
ATTENTION_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]


class CheckpointError(UserError):
    """The base checkpoint is missing, unreadable, or not a Gemma 3 MaxText can represent."""


def read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found; run the base_model stage first (dvc repro base_model)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def weight_names(model_dir: str) -> list[str]:
    """Tensor names of a safetensors checkpoint (sharded with an index, or a single file)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(json.load(f)["weight_map"])
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        from safetensors import safe_open

        with safe_open(single, framework="np") as f:
            return sorted(f.keys())
    raise CheckpointError(f"{model_dir}: no model.safetensors.index.json or model.safetensors; is it a HF checkpoint?")


def parameter_count(model_dir: str) -> int:
    """Number of weights in a safetensors checkpoint (from the file headers, nothing loaded)."""
    import math

    from safetensors import safe_open

    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    total = 0
    for name in files:
        path = os.path.join(model_dir, name)
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: missing (named by model.safetensors.index.json); re-run the base_model stage")
        with safe_open(path, framework="np") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def check_convertible(model_dir: str, model_name: str) -> str:
    """Fails with one line unless model_dir is a Gemma 3 checkpoint MaxText represents exactly;
    returns its tensor layout."""
    layout = detect_layout(model_dir)
    maxtext_model_args(model_dir, model_name)
    return layout


def detect_layout(model_dir: str) -> str:
    read_config(model_dir)  # a checkpoint without a readable config.json fails here, first
    names = weight_names(model_dir)
    for layout, prefix in LAYOUTS.items():
        if any(n.startswith(prefix["language_model"]) for n in names):
            return layout
    raise CheckpointError(
        f"{model_dir}: no Gemma 3 language-model tensors (expected names starting with "
        f"'{HUB_PREFIX['language_model']}' or '{TRANSFORMERS_PREFIX['language_model']}')"
    )


def rename(name: str, src: dict, dst: dict) -> str:
    for tower, prefix in src.items():
        if name.startswith(prefix):
            return dst[tower] + name[len(prefix) :]
    return name


# The text-config fields the flags and checks below read.
ARCHITECTURE_FIELDS = ("hidden_activation", "query_pre_attn_scalar", "head_dim", "hidden_size", "num_attention_heads",
                       "num_key_value_heads", "num_hidden_layers", "intermediate_size", "vocab_size", "sliding_window",
                       "rms_norm_eps", "layer_types", "rope_parameters", "final_logit_softcapping", "attn_logit_softcapping")
CONFIG_CACHE = os.path.join(".cache", "checkpoint-configs")


def text_config(model_dir: str) -> SimpleNamespace:
    """The checkpoint's text config as transformers normalises it (defaults filled in, rope
    parameters in today's form), cached under .cache/ by the bytes of config.json and the
    transformers version: loading it takes ~4 s (transformers imports torch for its rope
    code) and every stage reads it."""
    path = os.path.join(model_dir, "config.json")
    read_config(model_dir)  # a missing or broken config.json fails here, with one line
    with open(path, "rb") as f:
        key = hashlib.sha256(f.read() + importlib.metadata.version("transformers").encode()).hexdigest()[:24]
    cached = os.path.join(CONFIG_CACHE, f"{key}.json")
    try:
        with open(cached) as f:
            return SimpleNamespace(**json.load(f))
    except (OSError, json.JSONDecodeError):
        pass
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    text = getattr(config, "text_config", config)
    fields = json.loads(json.dumps({f: getattr(text, f, None) for f in ARCHITECTURE_FIELDS}))
    os.makedirs(CONFIG_CACHE, exist_ok=True)
    tmp = f"{cached}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(fields, f)
    os.replace(tmp, cached)
    return SimpleNamespace(**fields)


def maxtext_model_args(model_dir: str, model_name: str) -> list[str]:
    """MaxText flags that make its `model_name` architecture equal the checkpoint's config.

    Raises CheckpointError for a config MaxText's Gemma 3 decoder cannot represent, rather
    than converting it into a different model.
    """
    t = text_config(model_dir)
    problems = []
    if t.hidden_activation != "gelu_pytorch_tanh":
        problems.append(f"hidden_activation={t.hidden_activation!r} (MaxText's Gemma 3 uses tanh-GELU)")
    expected_scalar = t.head_dim if model_name in ("gemma3-4b", "gemma3-12b") else t.hidden_size // t.num_attention_heads
    if t.query_pre_attn_scalar != expected_scalar:
        problems.append(f"query_pre_attn_scalar={t.query_pre_attn_scalar} (MaxText's {model_name} scales queries by {expected_scalar}**-0.5)")
    pattern = [ATTENTION_PATTERN[i % 6] for i in range(t.num_hidden_layers)]
    if list(t.layer_types) != pattern:
        problems.append("layer_types is not Gemma 3's 5-local/1-global pattern")
    if t.final_logit_softcapping or t.attn_logit_softcapping:
        problems.append("logit soft-capping is set (Gemma 3 has none)")
    rope = t.rope_parameters
    full, local = rope["full_attention"], rope["sliding_attention"]
    if local.get("rope_type", "default") != "default" or full.get("rope_type") not in ("default", "linear"):
        problems.append(f"rope_parameters={rope} (MaxText supports linear scaling of global layers only)")
    if problems:
        raise CheckpointError(f"{model_dir}/config.json: not convertible by MaxText: " + "; ".join(problems))
    return [
        f"model_name={model_name}",
        "override_model_config=true",
        f"base_emb_dim={t.hidden_size}",
        f"base_mlp_dim={t.intermediate_size}",
        f"base_num_decoder_layers={t.num_hidden_layers}",
        f"base_num_query_heads={t.num_attention_heads}",
        f"base_num_kv_heads={t.num_key_value_heads}",
        f"head_dim={t.head_dim}",
        f"vocab_size={t.vocab_size}",
        f"sliding_window_size={t.sliding_window}",
        f"normalization_layer_epsilon={t.rms_norm_eps}",
        f"rope_max_timescale={int(full['rope_theta'])}",
        f"local_rope_max_timescale={int(local['rope_theta'])}",
        f"rope_linear_scaling_factor={float(full.get('factor', 1.0))}",
    ]


def export_rounding(path: tuple[str, ...], value, dtype: str, hf_config):
    """The value a MaxText parameter (at `path` in the model's state) has once exported to
    `dtype` and read back into MaxText's layout: the export check's reference computes with
    exactly the export's weights. MaxText's Gemma 3 mapping (param_mapping's hooks) exports
    the embedding divided by bf16(sqrt(hidden)) and every RMSNorm scale minus 1 (Gemma's 1+w);
    the rest unchanged; then stages/lib/export.py rounds each tensor to `dtype` once."""
    import ml_dtypes
    import numpy as np

    if dtype == "float32":
        return value

    def rounded(x):
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)

    if path[-1] == "embedding" and "token_embedder" in path:
        normalizer = np.float32(ml_dtypes.bfloat16(getattr(hf_config, "text_config", hf_config).hidden_size ** 0.5))
        # XLA (to_huggingface runs on CPU) divides by a constant as a multiply by its reciprocal.
        return rounded(value * (np.float32(1) / normalizer)) * normalizer
    if path[-1] == "scale" and len(path) > 1 and path[-2].endswith("norm"):
        return rounded(value - np.float32(1)) + np.float32(1)
    return rounded(value)


def maxtext_tokenizer_file() -> str:
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "assets", "tokenizers", "tokenizer.gemma3")


def gemma3_chat_template() -> str:
    """Gemma 3's chat template, as MaxText ships it (identical across Gemma 3 sizes)."""
    import maxtext

    path = os.path.join(os.path.dirname(maxtext.__file__), "examples", "chat_templates", "gemma-3-27b-chat_template.json")
    with open(path) as f:
        return json.load(f)["chat_template"]


@functools.lru_cache(maxsize=1)
def _tokenizer_files() -> dict[str, bytes]:
    """The HF tokenizer files, built once per process (converting the SentencePiece model
    takes seconds; they are the same bytes every time)."""
    import transformers

    with tempfile.TemporaryDirectory() as spm_dir, tempfile.TemporaryDirectory() as out_dir:
        shutil.copy(maxtext_tokenizer_file(), os.path.join(spm_dir, "tokenizer.model"))
        tokenizer = transformers.GemmaTokenizer.from_pretrained(spm_dir)
        tokenizer.init_kwargs.pop("vocab_file", None)  # a temporary path: would make the files differ per build
        tokenizer.chat_template = gemma3_chat_template()
        tokenizer.save_pretrained(out_dir)
        shutil.copy(maxtext_tokenizer_file(), os.path.join(out_dir, "tokenizer.model"))
        return {name: open(os.path.join(out_dir, name), "rb").read() for name in sorted(os.listdir(out_dir))}


def write_tokenizer(out_dir: str) -> None:
    """The real Gemma 3 tokenizer (SentencePiece model shipped in the MaxText wheel) as HF files."""
    for name, content in _tokenizer_files().items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(content)
