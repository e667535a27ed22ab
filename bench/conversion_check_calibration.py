"""How sensitive is the conversion check (convert_in's gate), and where do its limits sit?

    python -m tools.recipe small && dvc repro convert_in   # or tiny: once, for both checkpoints
    python -m bench.conversion_check_calibration              # one MaxText process for every row

MaxText runs once on the converted checkpoint (models/base-maxtext); transformers runs on the
base it came from (models/base-hf, the honest row) and on copies of it with one deliberate
fault each: what a wrong conversion computes, seen from the other side. Each row prints KL,
top-1 agreement and the largest logit difference beside params.yaml's `convert_in.check`
limits, which must pass the first row and fail every row that changes the model's function.

The faults: config fields MaxText's tables or a GGUF get wrong (the GGUF stores no local RoPE
theta, so transformers' default of 1e6 would be taken for Gemma's 1e4; MaxText's own tables
carry exact-erf GELU and 27B's query scaling), and the weight-mapping mistakes a converter
makes. One only a real model reveals: two norms of one layer exchanged, which a random model,
whose norm weights are all near zero, barely notices.
"""

import json
import os
import shutil
import tempfile

from bench.checkpoint_faults import edit_config, edit_tensor, reverse_heads, swap_layers, swap_tensors  # noqa: E402
from stages.lib import flags, gates, maxtext_process, paths  # noqa: E402
from stages.lib.params import load  # noqa: E402
from stages.shared import checkpoint


def variants(text: dict, model_name: str) -> list:
    rope = text.get("rope_parameters")
    if rope:  # transformers 5's per-layer-type form
        local_theta = edit_config(
            rope_parameters={**rope, "sliding_attention": {**rope["sliding_attention"], "rope_theta": 1_000_000.0}}
        )
    else:  # the Hub's older form
        local_theta = edit_config(rope_local_base_freq=1_000_000.0)
    return [
        ("honest conversion", None),
        ("local RoPE theta 1e6 (not in a GGUF)", local_theta),
        ("sliding window x 8", edit_config(sliding_window=text["sliding_window"] * 8)),
        (
            "query scaling of 27B (MaxText's table)",
            edit_config(query_pre_attn_scalar=text["hidden_size"] // text["num_attention_heads"]),
        ),
        ("exact-erf gelu (MaxText's table)", edit_config(hidden_activation="gelu")),
        ("embedding x 1.01", edit_tensor("embed_tokens.weight", lambda w: w * 1.01)),
        (
            "layer 3 input norm +1 (1+w convention dropped)",
            edit_tensor("layers.3.input_layernorm.weight", lambda w: w + 1),
        ),
        (
            "layer 3 feed-forward norms exchanged",
            swap_tensors("layers.3.pre_feedforward_layernorm.weight", "layers.3.post_feedforward_layernorm.weight"),
        ),
        ("layer 2 gate_proj x 1.05", edit_tensor("layers.2.mlp.gate_proj.weight", lambda w: w * 1.05)),
        ("layer 2 gate_proj x 1.01", edit_tensor("layers.2.mlp.gate_proj.weight", lambda w: w * 1.01)),
        ("layers 1 and 2 swapped", swap_layers(1, 2, model_name)),
        ("layer 0 q_proj heads reversed", reverse_heads("layers.0.self_attn.q_proj.weight", text["head_dim"])),
    ]


def main() -> None:
    params = load()
    limits = params["convert_in"]["check"]
    config = checkpoint.read_config(paths.BASE_HF)
    text = config.get("text_config", config)
    rows = variants(text, params["model"]["maxtext_name"])
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        copies = {}
        for i, (_, fault) in enumerate(rows[1:], start=1):
            copy = os.path.join(tmp, f"base-{i}")
            shutil.copytree(paths.BASE_HF, copy, copy_function=os.link)
            fault(copy)
            copies[copy] = os.path.join(tmp, f"report-{i}.json")
        honest = os.path.join(tmp, "report-0.json")
        maxtext_process.run(
            "convert_in.calibration", flags.conversion_check(params, paths.BASE_MAXTEXT, honest, copies), params
        )
        reports = []
        for path in [honest, *copies.values()]:
            with open(path) as f:
                reports.append(json.load(f))

    print(
        f"\n{params['model']['maxtext_name']} from {paths.BASE_HF} ({text['num_hidden_layers']} layers, hidden "
        f"{text['hidden_size']}); limits: max_kl {limits['max_kl']:g}, max_mean_kl {limits['max_mean_kl']:g}, "
        f"min_top1_agreement {limits['min_top1_agreement']:g}\n"
    )
    print(f"| {'conversion':48s} | KL max   | KL mean  | top-1  | max |dlogit| | check | failed on")
    print(f"|{'-' * 50}|----------|----------|--------|--------------|-------|----------")
    for (label, _), r in zip(rows, reports, strict=True):
        failures = gates.logit.threshold_failures(r, limits)
        print(
            f"| {label:48s} | {r['kl_max']:.2e} | {r['kl_mean']:.2e} | {r['top1_agreement']:.4f} | "
            f"{r['max_abs_logit_diff']:12.4f} | {'FAIL' if failures else 'pass':5s} | {'; '.join(failures)[:90]}"
        )


if __name__ == "__main__":
    main()
