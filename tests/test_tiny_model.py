"""The tiny base checkpoint: deterministic, in the Hub's layout, loadable, real tokenizer."""

import hashlib
import json
from pathlib import Path

import sentencepiece

from stages.shared import families
from stages.shared.families import gemma3


def digest(d) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_tiny_checkpoint_is_deterministic(tiny_base, tmp_path):
    a, c = tmp_path / "a", tmp_path / "c"
    a.mkdir()
    c.mkdir()
    gemma3.build_tiny(str(a), seed=0)
    assert digest(a) == digest(tiny_base)
    gemma3.build_tiny(str(c), seed=1)
    assert digest(c)["model-00001-of-00002.safetensors"] != digest(a)["model-00001-of-00002.safetensors"]


def test_tiny_checkpoint_loads_like_the_hub_model(tiny_base):
    import transformers

    assert families.detect_layout(str(tiny_base), "gemma3-4b") == "hub"  # like google/gemma-3-4b-it
    model, info = transformers.AutoModelForImageTextToText.from_pretrained(tiny_base, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert (
        json.loads((tiny_base / "config.json").read_text())["text_config"]["hidden_activation"] == "gelu_pytorch_tanh"
    )


def test_tokenizer_is_gemma3_sentencepiece(tiny_base):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(tiny_base)
    sp = sentencepiece.SentencePieceProcessor(model_file=gemma3.tokenizer_file())
    for text in [
        "What is the capital of Peru?",
        "17 plus 25 is 42.",
        "Spell the word rabbit backwards.",
        "naïve café, 東京",
    ]:
        assert hf(text, add_special_tokens=False)["input_ids"] == sp.encode(text)
    rendered = hf.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert rendered == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_maxtext_flags_for_the_real_gemma3_4b_config(tmp_path):
    """For google/gemma-3-4b-it's config the flags reproduce MaxText's gemma3-4b.yml
    (vocab_size aside: the checkpoint's 262208 rows are kept, not truncated to 262144)."""
    (tmp_path / "config.json").write_text((Path(__file__).parent / "data" / "gemma-3-4b-it.config.json").read_text())
    args = dict(a.split("=", 1) for a in families.maxtext_model_args(str(tmp_path), "gemma3-4b"))
    assert args["base_emb_dim"] == "2560" and args["base_mlp_dim"] == "10240"
    assert args["base_num_decoder_layers"] == "34" and args["head_dim"] == "256"
    assert args["base_num_query_heads"] == "8" and args["base_num_kv_heads"] == "4"
    assert args["rope_max_timescale"] == "1000000" and args["local_rope_max_timescale"] == "10000"
    assert args["rope_linear_scaling_factor"] == "8.0" and args["sliding_window_size"] == "1024"
    assert args["vocab_size"] == "262208"
