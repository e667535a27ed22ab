"""Qwen 3, dense (`qwen3-0.6b` ... `qwen3-32b`): `Qwen3ForCausalLM` checkpoints.

Traps found in MaxText's code, checked here rather than converted into a different model:
  - qk-norm: Qwen 3 normalises queries and keys per head (`use_qk_norm`, set by MaxText's
    qwen3 model configs; the mapping carries q_norm/k_norm).
  - Tied embeddings: 0.6B-4B tie the output layer to the embedding, 8B and larger do not.
    MaxText's configs fix it per size (`logits_via_embedding`); here it comes from the
    checkpoint, whatever the name.
  - Vocabulary padding: the config's vocab_size (151,936) is larger than the tokenizer's
    151,669 tokens; MaxText's hook pads or truncates the embedding to MaxText's vocab_size,
    so it is set to the checkpoint's: nothing is padded or cut.
  - MaxText's qwen3 block has plain RoPE and no sliding window: a rope_scaling (YaRN) or
    use_sliding_window checkpoint is refused, as are MoE checkpoints (another block).

The tiny model is a `Qwen3ForCausalLM` of 4 layers, hidden 128, tied like Qwen3-0.6B, with
Qwen 3's real tokenizer and chat template (shipped with MaxText: assets/tokenizers/qwen3-tokenizer):

    python -c "from stages.shared.families import qwen3; qwen3.build_tiny('/tmp/tiny-qwen', seed=0)"
"""

import os
import shutil

from stages.shared import tiny
from stages.shared.families import dimension_args, problems_in, refuse, rounded

NAME = "Qwen 3"
MAXTEXT_NAMES = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")
PIPELINE_TAG = "text-generation"  # the Hub's task for the model card
END_OF_TURN = "<|im_end|>"  # ends each turn of its template: where an answer ends
TINY = (
    "Qwen3ForCausalLM, 4 layers, hidden 128, tied embeddings; Qwen 3's own tokenizer and chat template "
    "(shipped with MaxText)"
)
LAYOUTS = {"transformers": {"language_model": "model.", "lm_head": "lm_head."}}

MODEL_TYPE = "qwen3"  # dense; Qwen 3 MoE (qwen3_moe) is another MaxText block
GGUF_ARCHITECTURE = "qwen3"  # general.architecture of its llama.cpp GGUF
GGUF_TOKENIZER = ("gpt2", "qwen2")  # byte-level BPE, with the Qwen 2/3 pre-tokenizer
CONFIG_FIELDS = (
    "hidden_act",
    "attention_bias",
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
    "use_sliding_window",
)


def model_args(t, model_name: str) -> list[str]:
    problems = problems_in(
        t,
        {
            "hidden_act": ("silu", "MaxText's Qwen 3 uses a SiLU-gated MLP"),
            "attention_bias": (False, "MaxText's Qwen 3 block has no attention biases"),
        },
    )
    if t.use_sliding_window:
        problems.append("use_sliding_window=True (MaxText's Qwen 3 block attends globally)")
    rope = t.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        problems.append(f"rope_scaling={rope} (MaxText's Qwen 3 block has plain RoPE)")
    refuse(problems)
    return [
        *dimension_args(t, model_name),
        f"rope_max_timescale={int(rope['rope_theta'])}",
        f"logits_via_embedding={str(bool(t.tie_word_embeddings)).lower()}",
    ]


def export_rounding(path: tuple[str, ...], value, dtype: str, hf_config):
    """MaxText's Qwen mapping moves every tensor without changing a value (transposes and
    reshapes; the embedding's pad is a no-op at the checkpoint's vocab_size)."""
    return rounded(value, dtype)


TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 40960,
    "max_window_layers": 4,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,  # as Qwen3-0.6B
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def build_tiny(out_dir: str, seed: int) -> None:
    generation = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}
    tiny.write_checkpoint(
        out_dir, TINY_CONFIG, generation, tiny.causal_lm_shapes(TINY_CONFIG, qk_norm=True), seed, norm_center=1.0
    )
    source = tiny.maxtext_asset("assets", "tokenizers", "qwen3-tokenizer")
    for name in sorted(os.listdir(source)):
        shutil.copyfile(os.path.join(source, name), os.path.join(out_dir, name))


def gguf_tensor(name: str, value, config):
    """llama.cpp's Qwen 3 computes as transformers does: every tensor as it is."""
    return value


def gguf_metadata(writer, config) -> dict:
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    return {}


# Ollama's template for Qwen 3 (Go text/template): ChatML, <|im_start|> and <|im_end|>.
OLLAMA_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}
{{- end }}"""
