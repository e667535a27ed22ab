"""How sensitive is the export check, and where do its thresholds sit?

    python -m tools.recipe tiny && dvc repro      # once, for models/sft-hf
    python -m bench.export_check_calibration        # one export check process for every row

Runs the export check (stages/in_maxtext/logit_check.py) on the honest export in models/sft-hf/
and on copies with one deliberate fault each (the config drift in MaxText's hard-coded
table, and the weight-mapping mistakes a converter can make), and prints each one's KL,
top-1 agreement and largest logit difference beside params.yaml's thresholds. The
thresholds must pass the first row and fail every row that changes the model's function.
"""

import os
import shutil
import tempfile

from bench.checkpoint_faults import edit_config, edit_tensor, reverse_heads, swap_layers  # noqa: E402
from stages import convert_out  # noqa: E402
from stages.lib.params import load  # noqa: E402

EXPORT = convert_out.OUT


VARIANTS = [
    ("honest export", None),
    ("rope_theta 10000 (MaxText's table)", edit_config(rope_theta=10000.0)),
    ("exact-erf gelu (MaxText's table)", edit_config(hidden_activation="gelu")),
    ("no linear RoPE scaling", edit_config(rope_scaling=None)),
    ("embedding x 1.01", edit_tensor("embed_tokens.weight", lambda w: w * 1.01)),
    ("layer 3 input norm +1 (1+w convention dropped)", edit_tensor("layers.3.input_layernorm.weight", lambda w: w + 1)),
    ("layer 2 gate_proj x 1.05", edit_tensor("layers.2.mlp.gate_proj.weight", lambda w: w * 1.05)),
    ("layer 2 gate_proj x 1.01", edit_tensor("layers.2.mlp.gate_proj.weight", lambda w: w * 1.01)),
    ("layer 5 v_proj x 1.02", edit_tensor("layers.5.self_attn.v_proj.weight", lambda w: w * 1.02)),
    ("layers 1 and 2 swapped", swap_layers(1, 2, "gemma3-4b")),
    ("layer 0 q_proj heads reversed", reverse_heads("layers.0.self_attn.q_proj.weight", 32)),
]


def main() -> None:
    params = load()
    limits = params["convert_out"]["check"]
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        exports = {}
        for i, (_, corrupt) in enumerate(VARIANTS):
            copy = os.path.join(tmp, f"export-{i}")
            shutil.copytree(EXPORT, copy, copy_function=os.link)
            if corrupt:
                corrupt(copy)
            exports[copy] = os.path.join(tmp, f"report-{i}.json")
        # One MaxText process, one reference for every copy (stages/in_maxtext/logit_check.py).
        checked = convert_out.check_exports(params, exports)
    rows = [(label, report, failures) for (label, _), (report, failures) in zip(VARIANTS, checked, strict=True)]

    print(
        f"\nthresholds: max_kl {limits['max_kl']:g}, max_mean_kl {limits['max_mean_kl']:g}, "
        f"min_top1_agreement {limits['min_top1_agreement']:g} (tie_margin {limits['tie_margin']:g})\n"
    )
    print(f"| {'variant':48s} | KL max   | KL mean  | top-1  | max |dlogit| | check | failed on")
    print(f"|{'-' * 50}|----------|----------|--------|--------------|-------|----------")
    for label, r, failures in rows:
        print(
            f"| {label:48s} | {r['kl_max']:.2e} | {r['kl_mean']:.2e} | {r['top1_agreement']:.4f} | "
            f"{r['max_abs_logit_diff']:12.4f} | {'FAIL' if failures else 'pass':5s} | {'; '.join(failures)[:90]}"
        )
    rounding = rows[0][1]["rounding"]
    print(
        f"\nrounding the trained float32 weights to {rounding['dtype']} (information, not gated): "
        f"KL max {rounding['kl_max']:.2e}, KL mean {rounding['kl_mean']:.2e}, top-1 {rounding['top1_agreement']:.4f}"
    )


if __name__ == "__main__":
    main()
