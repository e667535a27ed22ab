"""The gates' MaxText forward: one row per prompt padded to the longest, against the prompts packed.

    python -m tools.recipe small && dvc repro convert_in   # once: models/base-hf, models/base-maxtext
    python -m bench.check_packing                           # ~4 minutes for the 270M on 2 cores

The conversion check's MaxText side (stages/in_maxtext/logit_check.py) on the converted
checkpoint, float32, on the fixed prompts, in two layouts: (A) a row per prompt, each padded
to the long one, as the checks ran before; (B) `logit_check.packing`'s rows, each prompt its
own segment, as they run now. Alternating A B B A, each building its model afresh. Prints per
layout the tokens computed, the seconds of the first forward (compile and run) and of a
second (run), and the largest logit difference between the layouts (float32 noise if the
segments keep the prompts apart).
"""

import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from stages.in_maxtext import logit_check  # noqa: E402
from stages.lib import flags, paths  # noqa: E402
from stages.lib.params import load  # noqa: E402
from stages.shared.prompts import fixed_prompts  # noqa: E402


def main() -> None:
    import jax

    params = load()
    args = flags.conversion_check(params, paths.BASE_MAXTEXT, "unused").args
    maxtext_args = args[args.index("--") + 1 :]
    _, prompts = fixed_prompts(paths.BASE_HF)
    lengths = [len(p) for p in prompts]
    devices = jax.device_count()
    padded = ([[i] for i in range(len(prompts))] + [[]] * (-len(prompts) % devices), max(lengths))
    layouts = {"A": padded, "B": logit_check.packing(lengths, devices)}
    first, again, out = {"A": [], "B": []}, {"A": [], "B": []}, {}
    for way in ("A", "B", "B", "A"):
        model, mesh, layout = logit_check.maxtext_model(maxtext_args, prompts, layout=layouts[way])
        start = time.perf_counter()
        out[way] = logit_check.logits(model, mesh, layout, prompts)
        first[way].append(time.perf_counter() - start)
        start = time.perf_counter()
        logit_check.logits(model, mesh, layout, prompts)
        again[way].append(time.perf_counter() - start)
        del model
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out["A"], out["B"], strict=True))
    print(f"prompts: {lengths} tokens, {devices} device(s)")
    for way, name in (("A", "a row per prompt, padded"), ("B", "packed")):
        rows, length = layouts[way]
        print(
            f"{way} {name}: {len(rows)} x {length} = {len(rows) * length} tokens;"
            f" first forward {statistics.median(first[way]):.2f} s {[round(s, 2) for s in first[way]]},"
            f" again {statistics.median(again[way]):.2f} s {[round(s, 2) for s in again[way]]}"
        )
    print(
        f"B / A: first {statistics.median(first['B']) / statistics.median(first['A']):.3f},"
        f" again {statistics.median(again['B']) / statistics.median(again['A']):.3f};"
        f" largest logit difference between the layouts: {diff:.2e}"
    )


if __name__ == "__main__":
    main()
