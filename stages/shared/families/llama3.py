"""Llama 3 (`llama3.1-8b`, `llama3.1-70b`, `llama3.1-405b`): `LlamaForCausalLM` checkpoints,
Llama 3.0 and 3.1 (MaxText's llama2 decoder block with Llama 3.1's RoPE).

Traps found in MaxText's code, checked here rather than converted into a different model:
  - RoPE scaling: MaxText's LLaMARotaryEmbedding hard-codes Llama 3.1's (factor 8, low/high
    frequency factors 1 and 4, original context 8192; maxtext/layers/embeddings.py). Llama
    3.2's 1B and 3B use factor 32, which MaxText cannot express: refused. No scaling
    (Llama 3.0) is `rope_use_scale=false`.
  - The converter scales the query projection by 1/sqrt(head_dim) into MaxText and back,
    and permutes q/k between HF's half-split and MaxText's interleaved RoPE layout
    (param_mapping's LLAMA31 hooks): export_rounding rounds the query as the export does.
  - Tied embeddings (Llama 3.2): `logits_via_embedding`, from the checkpoint.
  - No biases, SiLU-gated MLP: anything else is another architecture.

The tiny model is a `LlamaForCausalLM` of 4 layers, hidden 128, with Llama 3's real
vocabulary (the tiktoken file MaxText ships, tokenizer_llama3.tiktoken, as HF files with
MaxText's names for the 256 special tokens) and Llama 3's chat template, written here (no
installed package ships it: Meta's Llama-3-Instruct template, without 3.1's date header):

    python -c "from stages.shared.families import llama3; llama3.build_tiny('/tmp/tiny-llama', seed=0)"
"""

import functools
import os
import tempfile

from stages.shared import tiny
from stages.shared.families import dimension_args, problems_in, refuse, rounded

NAME = "Llama 3"
MAXTEXT_NAMES = ("llama3.1-8b", "llama3.1-70b", "llama3.1-405b")
PIPELINE_TAG = "text-generation"  # the Hub's task for the model card
END_OF_TURN = "<|eot_id|>"  # ends each turn of its template: where an answer ends
END_OF_MESSAGE = "<|eom_id|>"  # Llama 3.1's end of a tool-calling turn: its generation config's too
TINY = (
    "LlamaForCausalLM, 4 layers, hidden 128; Llama 3's vocabulary (MaxText's tokenizer_llama3.tiktoken) and "
    "Meta's Llama 3 Instruct chat template (written in stages/shared/families/llama3.py)"
)
LAYOUTS = {"transformers": {"language_model": "model.", "lm_head": "lm_head."}}

MODEL_TYPE = "llama"
GGUF_ARCHITECTURE = "llama"  # general.architecture of its llama.cpp GGUF
GGUF_TOKENIZER = ("gpt2", "llama-bpe")  # byte-level BPE, with Llama 3's pre-tokenizer
CONFIG_FIELDS = (
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "head_dim",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "rms_norm_eps",
    "rope_parameters",
    "tie_word_embeddings",
)
# What MaxText's LLaMARotaryEmbedding computes (maxtext/layers/embeddings.py, hard-coded).
MAXTEXT_LLAMA31_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def model_args(t, model_name: str) -> list[str]:
    problems = problems_in(
        t,
        {
            "hidden_act": ("silu", "MaxText's Llama uses a SiLU-gated MLP"),
            "attention_bias": (False, "MaxText's Llama has no attention biases"),
            "mlp_bias": (False, "MaxText's Llama has no MLP biases"),
        },
    )
    rope = t.rope_parameters or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type == "llama3":
        scaling = {k: float(rope.get(k, -1)) for k in MAXTEXT_LLAMA31_ROPE}
        if scaling != MAXTEXT_LLAMA31_ROPE:
            problems.append(
                f"rope_scaling={scaling} (MaxText computes Llama 3.1's {MAXTEXT_LLAMA31_ROPE} only; "
                "Llama 3.2's factor 32 is not expressible)"
            )
    elif rope_type != "default":
        problems.append(f"rope_scaling type {rope_type!r} (MaxText's Llama supports Llama 3.1's scaling or none)")
    refuse(problems)
    return [
        *dimension_args(t, model_name),
        f"rope_max_timescale={int(rope['rope_theta'])}",
        f"rope_use_scale={str(rope_type == 'llama3').lower()}",
        f"logits_via_embedding={str(bool(t.tie_word_embeddings)).lower()}",
    ]


def export_rounding(path: tuple[str, ...], value, dtype: str, hf_config):
    """MaxText's Llama mapping exports the query projection times sqrt(head_dim) (in float32,
    then rounded to `dtype` by stages/in_maxtext/assemble_export.py) and reads it back times 1/sqrt(head_dim);
    q/k's RoPE permutation moves values without changing them; the rest is rounded as is."""
    import numpy as np

    if dtype == "float32":
        return value
    if path[-1] == "kernel" and len(path) > 1 and path[-2] == "query":
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        return rounded(value * np.float32(np.sqrt(head_dim)), dtype) * np.float32(1 / np.sqrt(head_dim))
    return rounded(value, dtype)


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 128,
    "head_dim": 32,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,  # as Llama 3.1 8B
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

# Meta's Llama 3 Instruct template: every turn as a header and <|eot_id|>, BOS first.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def build_tiny(out_dir: str, seed: int) -> None:
    generation = {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}
    tiny.write_checkpoint(
        out_dir, TINY_CONFIG, generation, tiny.causal_lm_shapes(TINY_CONFIG, qk_norm=False), seed, norm_center=1.0
    )
    for name, content in _tokenizer_files().items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(content)


@functools.lru_cache(maxsize=1)
def _tokenizer_files() -> dict[str, bytes]:
    """Llama 3's tokenizer as HF files, from the tiktoken file MaxText ships: MaxText's
    special tokens, pattern and vocabulary (maxtext/input_pipeline/tokenizer.py), and, as
    the Hub's tokenizer.json does, <|begin_of_text|> added in front of every encoding."""
    import transformers
    from maxtext.input_pipeline.tokenizer import TikTokenTokenizer
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = tiny.maxtext_asset("assets", "tokenizers", "tokenizer_llama3.tiktoken")
    special = TikTokenTokenizer(path, add_bos=False, add_eos=False).special_tokens
    backend = TikTokenConverter(
        vocab_file=path, pattern=TikTokenTokenizer.pat_str, extra_special_tokens=sorted(special, key=special.get)
    ).converted()
    bos = "<|begin_of_text|>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, special[bos])]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<|eot_id|>",
        model_max_length=131072,
        chat_template=CHAT_TEMPLATE,
    )
    with tempfile.TemporaryDirectory() as out:
        tokenizer.save_pretrained(out)
        return {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))}


def _rotary_order(w, heads: int):
    """q or k rows reordered as llama.cpp's converter does (`LlamaModel.permute`): within each
    head, the two rotary halves interleaved, the order llama.cpp's RoPE kernel pairs them in."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensor(name: str, value, config):
    if name.endswith("self_attn.q_proj.weight"):
        return _rotary_order(value, config.num_attention_heads)
    if name.endswith("self_attn.k_proj.weight"):
        return _rotary_order(value, config.num_key_value_heads)
    return value


def gguf_metadata(writer, config) -> dict:
    """Llama 3's RoPE: its base, the rotary dimension, and the llama3 scaling as llama.cpp
    takes it: one factor per rotary frequency in the tensor rope_freqs.weight (what
    convert_hf_to_gguf.py computes from rope_scaling)."""
    import math

    import numpy as np

    rope = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    if rope.get("rope_type") != "llama3":
        return {}
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old = rope["original_max_position_embeddings"]
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    factors = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < old / high:
            factors.append(1.0)
        elif wavelength > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return {"rope_freqs.weight": np.asarray(factors, dtype=np.float32)}


# Ollama's template for Llama 3 (Go text/template): Meta's headers and <|eot_id|>.
OLLAMA_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>
{{- if and $last (ne .Role "assistant") }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}"""
