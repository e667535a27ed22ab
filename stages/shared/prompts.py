"""The fixed chat prompts every logit gate runs (the conversion and export checks in MaxText's
process, stages/in_maxtext/logit_check.py; the GGUF check, stages/lib/gguf_check.py): the same
token ids on both sides of each comparison.
"""

# Fixed prompts: short, multi-turn, with a system prompt; a long one is added per model so
# that sliding-window (local) attention layers see more than their window.
PROMPTS = [
    [{"role": "user", "content": "What is the capital of Peru?"}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is 17 plus 25?"},
        {"role": "assistant", "content": "17 plus 25 is 42."},
        {"role": "user", "content": "And if you double that?"},
    ],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue, then list three colours of a sunset."}],
]
LONG_TEXT = (
    "A river runs past the old mill; children play by the water while birds sing in the "
    "willows, and the miller counts sacks of grain for the market on Thursday. "
)


def prompt_token_ids(tokenizer, sliding_window: int) -> list[list[int]]:
    ids = [
        list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)["input_ids"]) for p in PROMPTS
    ]
    long = LONG_TEXT
    while True:
        tokens = list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": long}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        if len(tokens) > sliding_window + 16:
            return ids + [tokens]
        long += LONG_TEXT


def fixed_prompts(model_dir: str):
    """The checkpoint's config and the fixed prompts in its tokenizer's ids; the long prompt is
    longer than a sliding window (Gemma 3's local layers), or 64 tokens."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    text = getattr(hf_config, "text_config", hf_config)
    return hf_config, prompt_token_ids(tokenizer, getattr(text, "sliding_window", None) or 64)
