"""Where do MaxText and transformers part on a Gemma 3, and is it ours to fix?

    python -m tools.recipe small && dvc repro convert_in   # once: models/base-hf, models/base-maxtext
    python -m bench.gate_floor                                # ~3 minutes for the 270M
    python -m bench.gate_floor --layers                       # only the layer-by-layer search

Runs MaxText on the converted checkpoint (models/base-maxtext, float32, exactly as the
conversion check does) and transformers on models/base-hf (float32) on the export check's
prompts, and prints the KL of MaxText's next-token distributions from transformers':
  1. as the conversion check compares them;
  2. with transformers' input embedding scaled by bf16(sqrt(hidden)), as MaxText's converter
     folds it into the embedding (transformers in float32 uses sqrt(hidden) exactly; in bf16,
     as Google's Gemma reference, the bf16 value);
  3. with, in addition, transformers' logits times bf16(sqrt(hidden)) / sqrt(hidden): MaxText
     reads logits off the same pre-scaled embedding and divides by the exact sqrt(hidden)
     (`normalize_embedding_logits`), so its logits are that much smaller.
If row 3 is at float32's noise, the two libraries differ by these two constants and nothing
else. Then, layer by layer in transformers alone, how far the input scale of row 2 moves each
layer's output at the first positions (BOS, <start_of_turn>), where Gemma's residual stream
carries its massive activations. Last, where the libraries part: both truncated to their first
k layers the same way (the post-attention and post-MLP norm scales of every later layer set to
zero, so those layers add nothing to the residual stream), KL at each position of prompt 0.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from stages.in_maxtext import logit_check  # noqa: E402
from stages.lib import flags, paths  # noqa: E402
from stages.lib.params import load  # noqa: E402
from stages.shared import logits  # noqa: E402
from stages.shared.prompts import prompt_token_ids  # noqa: E402


def kl_rows(reference: list[np.ndarray], candidate: list[np.ndarray]) -> tuple[float, float, tuple[int, int]]:
    """KL(reference || candidate): max, token-weighted mean, and (prompt, position) of the max."""
    per = []
    for r, c in zip(reference, candidate, strict=True):
        lp, lq = logits.log_softmax(r), logits.log_softmax(c)
        per.append(np.sum(np.exp(lp) * (lp - lq), axis=-1))
    worst = max(range(len(per)), key=lambda i: per[i].max())
    flat = np.concatenate(per)
    return float(flat.max()), float(flat.mean()), (worst, int(per[worst].argmax()))


def truncate_maxtext(model, keep: int, pattern: int = 6, scan_axis: int = 1) -> None:
    """Layers >= keep add nothing: their post-norm scales (MaxText stores 1+w) set to 0.
    Scanned layers: layers_j stacks layers j, j+6, j+12, ... on MaxText's `param_scan_axis`
    (1 by default; a Gemma 3 of a whole number of 6-layer patterns, as the 270M's 18: no
    remainder layers)."""
    import jax.numpy as jnp
    from flax import nnx

    state = nnx.state(model, nnx.Param)
    for path, variable in nnx.to_flat_state(state):
        names = [str(k) for k in path]
        if names[-2] not in ("post_self_attention_norm", "post_ffw_norm"):
            continue
        if "layers_remainder" in names:
            raise SystemExit("truncate_maxtext: remainder layers are not handled (use a model of 6k layers)")
        j = int(next(n for n in names if n.startswith("layers_")).split("_")[1])
        value = np.moveaxis(np.asarray(variable[...]), scan_axis, 0).copy()
        for i in range(value.shape[0]):
            if j + pattern * i >= keep:
                value[i] = 0
        variable[...] = jnp.asarray(np.moveaxis(value, 0, scan_axis), dtype=variable[...].dtype)
    nnx.update(model, state)


def truncate_transformers(hf, keep: int) -> None:
    """The same in transformers: Gemma's norms scale by 1+w, so w = -1."""
    import torch

    with torch.no_grad():
        for layer in hf.model.layers[keep:]:
            layer.post_attention_layernorm.weight.fill_(-1.0)
            layer.post_feedforward_layernorm.weight.fill_(-1.0)


def main() -> None:
    import ml_dtypes
    import torch
    import transformers

    params = load()
    args = flags.conversion_check(params, paths.BASE_MAXTEXT, "unused").args
    maxtext_args = args[args.index("--") + 1 :]
    tokenizer = transformers.AutoTokenizer.from_pretrained(paths.BASE_HF)
    config = transformers.AutoConfig.from_pretrained(paths.BASE_HF)
    text = getattr(config, "text_config", config)
    prompts = prompt_token_ids(tokenizer, text.sliding_window or 64)
    if "--layers" in sys.argv:
        return localise(maxtext_args, prompts)

    model, mesh, packed = logit_check.maxtext_model(maxtext_args, prompts)
    maxtext = logit_check.logits(model, mesh, packed, prompts)
    del model

    hf = transformers.AutoModelForCausalLM.from_pretrained(paths.BASE_HF, dtype=torch.float32).eval()
    embed = hf.get_input_embeddings()
    exact = float(embed.embed_scale)
    folded = float(ml_dtypes.bfloat16(text.hidden_size**0.5))

    def run(scale: float, hidden: bool = False):
        embed.embed_scale.fill_(scale)
        with torch.no_grad():
            outs = [hf(input_ids=torch.tensor([p]), output_hidden_states=hidden) for p in prompts]
        return outs

    as_is = run(exact, hidden=True)
    scaled = run(folded, hidden=True)
    logits = {
        "1. transformers as the check runs it": [o.logits[0].numpy() for o in as_is],
        f"2. input embedding x {folded:.4f} (bf16), not {exact:.4f}": [o.logits[0].numpy() for o in scaled],
        f"3. and logits x {folded / exact:.6f} (MaxText's normaliser)": [
            o.logits[0].numpy() * (folded / exact) for o in scaled
        ],
    }
    print(
        f"\nMaxText on {paths.BASE_MAXTEXT} vs transformers on {paths.BASE_HF}, float32, {len(prompts)} prompts "
        f"({sum(map(len, prompts))} positions)\n"
    )
    print(f"| {'transformers variant':58s} | KL max   | KL mean  | at (prompt, position)")
    print(f"|{'-' * 60}|----------|----------|----------------------")
    for label, candidate in logits.items():
        kl_max, kl_mean, where = kl_rows(candidate, maxtext)
        print(f"| {label:58s} | {kl_max:.2e} | {kl_mean:.2e} | {where}")

    print(
        "\nLayer by layer (transformers alone): relative change of each layer's output when the input scale is "
        "MaxText's, at positions 0-2 of prompt 0, and the residual stream's largest |x| there"
    )
    print("| layer | rel. change pos 0 | pos 1 | pos 2 | max |x| pos 0 | pos 1 |")
    print("|-------|-------------------|-------|-------|--------------|-------|")
    for layer, (a, b) in enumerate(zip(as_is[0].hidden_states, scaled[0].hidden_states, strict=True)):
        a, b = a[0].numpy(), b[0].numpy()
        rel = np.linalg.norm(a - b, axis=-1) / np.linalg.norm(a, axis=-1)
        print(
            f"| {layer:5d} | {rel[0]:17.2e} | {rel[1]:.2e} | {rel[2]:.2e} | {np.abs(a[0]).max():12.0f} | "
            f"{np.abs(a[1]).max():5.0f} |"
        )


def localise(maxtext_args, prompts, keeps=(0, 1, 2, 3, 6, 12, 13, 14, 15, 16, 17, 18)) -> None:
    """KL per position of prompt 0, both libraries truncated to their first k layers, with
    MaxText's two embedding constants (rows 2 and 3) given to transformers."""
    import ml_dtypes
    import torch
    import transformers

    short = prompts[:1]
    print(
        f"\n| first k layers | KL per position of prompt 0 ({len(short[0])} tokens): MaxText vs transformers with "
        "MaxText's constants"
    )
    for keep in keeps:
        model, mesh, packed = logit_check.maxtext_model(maxtext_args, short)
        truncate_maxtext(model, keep)
        m = logit_check.logits(model, mesh, packed, short)[0]
        del model
        hf = transformers.AutoModelForCausalLM.from_pretrained(paths.BASE_HF, dtype=torch.float32).eval()
        truncate_transformers(hf, keep)
        embed = hf.get_input_embeddings()
        exact = float(embed.embed_scale)
        folded = float(ml_dtypes.bfloat16(hf.config.hidden_size**0.5))
        embed.embed_scale.fill_(folded)
        with torch.no_grad():
            t = hf(input_ids=torch.tensor(short)).logits[0].numpy() * (folded / exact)
        lp, lq = logits.log_softmax(t), logits.log_softmax(m)
        kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)
        print(f"| {keep:14d} | " + " ".join(f"{v:.1e}" for v in kl), flush=True)


if __name__ == "__main__":
    main()
