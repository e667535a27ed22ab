"""The export check: does the HF export compute what the MaxText checkpoint computes?

Run by convert_out (through stages.lib.maxtext_main, like MaxText's own entry points):

    python -m stages.lib.maxtext_main stages.lib.export_check -- \
        --export models/sft-hf --report R.json -- <MaxText flags incl. load_parameters_path>

It runs a few fixed chat prompts through MaxText (float32, from the Orbax parameters) and
through `transformers` (float32, from the export) and writes, per prompt, the KL divergence
of the export's next-token distribution from MaxText's, top-1 agreement, and the largest
logit difference. convert_out compares these with params.yaml's thresholds.
"""

import argparse
import json
import sys

import numpy as np

# Fixed prompts: short, multi-turn, with a system prompt; a long one is added per model so
# that sliding-window (local) attention layers see more than their window.
PROMPTS = [
    [{"role": "user", "content": "What is the capital of Peru?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "What is 17 plus 25?"},
     {"role": "assistant", "content": "17 plus 25 is 42."},
     {"role": "user", "content": "And if you double that?"}],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue, then list three colours of a sunset."}],
]
LONG_TEXT = ("A river runs past the old mill; children play by the water while birds sing in the "
             "willows, and the miller counts sacks of grain for the market on Thursday. ")


def prompt_token_ids(tokenizer, sliding_window: int) -> list[list[int]]:
    ids = [list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)["input_ids"]) for p in PROMPTS]
    long = LONG_TEXT
    while True:
        tokens = list(tokenizer.apply_chat_template([{"role": "user", "content": long}], add_generation_prompt=True,
                                                    tokenize=True)["input_ids"])
        if len(tokens) > sliding_window + 16:
            return ids + [tokens]
        long += LONG_TEXT


def maxtext_logits(maxtext_args: list[str], prompts: list[list[int]]) -> list[np.ndarray]:
    import jax
    import jax.numpy as jnp
    from maxtext.common.common_types import MODEL_MODE_TRAIN
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    length = max(len(p) for p in prompts)
    n_dev = jax.device_count()
    batch = -(-len(prompts) // n_dev) * n_dev  # a whole number of rows per device
    config = pyconfig.initialize_pydantic(
        ["export_check"] + maxtext_args
        + [f"max_target_length={length}", f"per_device_batch_size={batch // n_dev}", "dtype=float32", "run_name=export_check"]
    )
    model, mesh = model_creation_utils.from_pretrained(config)
    if config.lora.enable_lora:  # base + adapter, as MaxText trained it (train_sft does the same)
        from flax.core.spmd import logical_axis_rules
        from maxtext.utils import lora_utils

        with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
            model = lora_utils.apply_lora_to_model(model, mesh, config)
            lora_utils.restore_lora_from_path(model, config)
    tokens = np.zeros((batch, length), np.int32)
    segments = np.zeros((batch, length), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
        segments[i, : len(p)] = 1
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
    with jax.set_mesh(mesh):
        logits = model(jnp.asarray(tokens), jnp.asarray(positions), decoder_segment_ids=jnp.asarray(segments),
                       enable_dropout=False, model_mode=MODEL_MODE_TRAIN)
    logits = np.asarray(jax.device_get(logits), dtype=np.float32)
    return [logits[i, : len(p)] for i, p in enumerate(prompts)]


def transformers_logits(export_dir: str, prompts: list[list[int]]) -> list[np.ndarray]:
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(export_dir)
    auto = transformers.AutoModelForImageTextToText if hasattr(config, "vision_config") else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(export_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            out.append(model(input_ids=torch.tensor([p])).logits[0].float().numpy())
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(reference: np.ndarray, candidate: np.ndarray, tie_margin: float) -> dict:
    """KL(reference || candidate) per position, top-1 agreement, largest logit difference.

    A position agrees when the candidate's top token is within `tie_margin` of the
    reference's best logit (near-ties in the reference are not counted as disagreements).
    """
    lp, lq = log_softmax(reference), log_softmax(candidate)
    kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)
    picked = reference[np.arange(len(reference)), candidate.argmax(-1)]
    agree = picked >= reference.max(-1) - tie_margin
    return {
        "tokens": len(reference),
        "kl_max": float(kl.max()),
        "kl_mean": float(kl.mean()),
        "top1_agreement": float(agree.mean()),
        "max_abs_logit_diff": float(np.abs(reference - candidate).max()),
    }


def main() -> None:
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--export", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--tie-margin", type=float, required=True)
    ours = parser.parse_args(sys.argv[1:split])

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(ours.export)
    config = transformers.AutoConfig.from_pretrained(ours.export)
    text = getattr(config, "text_config", config)
    prompts = prompt_token_ids(tokenizer, text.sliding_window)
    reference = maxtext_logits(sys.argv[split + 1 :], prompts)
    candidate = transformers_logits(ours.export, prompts)
    per_prompt = [compare(r, c, ours.tie_margin) for r, c in zip(reference, candidate)]
    report = {
        "prompts": per_prompt,
        "kl_max": max(p["kl_max"] for p in per_prompt),
        "kl_mean": float(np.average([p["kl_mean"] for p in per_prompt], weights=[p["tokens"] for p in per_prompt])),
        "top1_agreement": float(np.average([p["top1_agreement"] for p in per_prompt], weights=[p["tokens"] for p in per_prompt])),
        "max_abs_logit_diff": max(p["max_abs_logit_diff"] for p in per_prompt),
    }
    with open(ours.report, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
