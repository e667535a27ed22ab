"""Conversion on a mid-size (~1 GB) Gemma-3-architecture checkpoint: time vs reading the bytes, peak RSS.

    python -m bench.conversion --reps 1   # ~6 minutes on 2 cores, ~5 GB of free disk

The checkpoint is the tiny Gemma 3 (stages/shared/families/gemma3.py) at wider, deeper dimensions (random bf16
weights, the real vocabulary, the Hub's layout). `python -m stages.convert_in` and
`python -m stages.convert_out` run on it as `dvc repro` would run them; convert_out's
MaxText step (to_huggingface) is timed apart from its export check. The baseline is reading
the same bytes from disk, with both inputs dropped from the page cache first. Peak RSS is
sampled every 0.1 s per process: the MaxText child doing the conversion is what is reported.
"""

import os
import shutil
import sys
from pathlib import Path

from bench.common import (
    GB,
    GIB,
    Row,
    evict,
    log,
    median,
    new_workspace,
    read_all,
    run_alone,
    stage_seconds,
    timed,
    verdict,
)  # noqa: E402

# ~1.06 GB in bf16: a 604 MB embedding (Gemma 3's 262k vocabulary) and 12 layers of 19M parameters.
MID_TEXT = {
    "hidden_size": 1152,
    "intermediate_size": 4608,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
}
TO_MAXTEXT = "maxtext.checkpoint_conversion.to_maxtext"
TO_HF = "maxtext.checkpoint_conversion.to_huggingface"


def weights_bytes(checkpoint: Path) -> int:
    return sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))


def measure(root: Path, stage: str, module: str, source: Path) -> dict:
    """One run of `stage` on `source`, and the baseline: reading source's bytes, both from disk."""
    evict(source)
    read_s = read_all(source)
    evict(source)
    log(f"conversion: {stage}")
    run = timed([sys.executable, "-m", f"stages.{stage}"], root, sample_rss=True)
    times = stage_seconds(run.output)
    return {
        "read": read_s,
        "seconds": times[f"{stage}:{module}"],
        "rss": run.peak_rss[module],
        "gate": times.get("convert_out.check:stages.in_maxtext.logit_check"),
    }


def bench(work: Path, reps: int = 1, runtime_rss: dict[str, int] | None = None) -> list[Row]:
    """runtime_rss: the same processes' peaks on the tiny model (bench/pipeline.py), i.e. what
    JAX, MaxText and transformers hold before any weights; reported alongside if given."""
    from stages.shared.families import gemma3

    root = new_workspace(work / "mid")
    models = root / "models"
    base = models / "base-hf"
    base.mkdir(parents=True)
    log("conversion: building a ~1 GB random Gemma 3 checkpoint")
    gemma3.build_tiny(str(base), seed=0, text=MID_TEXT)
    size = weights_bytes(base)
    runs = {"convert_in": [], "convert_out": []}
    for _ in range(reps):
        shutil.rmtree(models / "base-maxtext", ignore_errors=True)
        runs["convert_in"].append(measure(root, "convert_in", TO_MAXTEXT, base))
        # convert_out's input: the converted base as if it were the trained parameters.
        params = models / "sft-maxtext" / "params"
        shutil.rmtree(params.parent, ignore_errors=True)
        shutil.copytree(models / "base-maxtext" / "0" / "items", params, copy_function=os.link)
        shutil.rmtree(models / "sft-hf", ignore_errors=True)
        runs["convert_out"].append(measure(root, "convert_out", TO_HF, params))
    shutil.rmtree(root)

    rows = []
    for stage, module in (("convert_in", TO_MAXTEXT), ("convert_out", TO_HF)):
        seconds, read_s = median([r["seconds"] for r in runs[stage]]), median([r["read"] for r in runs[stage]])
        rss = max(r["rss"] for r in runs[stage])
        multiple = rss / size
        size_note = f"{size / GB:.2f} GB of bf16 weights; reading them from disk took {read_s:.2f} s; {reps} rep(s)"
        rss_notes = []
        if runtime_rss and module in runtime_rss:
            fixed = runtime_rss[module]
            rss_notes.append(
                f"the same process on the tiny model peaks at {fixed / GIB:.2f} GiB (JAX, MaxText, "
                f"transformers and the tokenizer); above that, the weights cost {(rss - fixed) / size:.2f}x their size"
            )
        rows.append(
            Row(
                f"5. {stage}: {module.rsplit('.', 1)[1]} on a ~1 GB checkpoint vs reading it",
                f"{seconds:.1f} s",
                f"{read_s:.2f} s",
                f"{seconds / read_s:.0f}x",
                "time: info",
                "info",
                [size_note],
            )
        )
        rows.append(
            Row(
                f"5. {stage}: peak RSS / checkpoint size",
                f"{rss / GIB:.2f} GiB",
                f"{size / GIB:.2f} GiB",
                f"{multiple:.2f}x",
                "<= 1.5x",
                verdict(multiple <= 1.5, f"peak RSS {multiple:.2f}x the model"),
                rss_notes,
            )
        )
    gate, conversion = (
        median([r["gate"] for r in runs["convert_out"]]),
        median([r["seconds"] for r in runs["convert_out"]]),
    )
    rows.append(
        Row(
            "5. export check on the ~1 GB export (in convert_out)",
            f"{gate:.1f} s",
            f"{conversion:.1f} s",
            f"{gate / conversion:.2f}x",
            "info (vs the conversion)",
            "info",
        )
    )
    return rows


if __name__ == "__main__":
    run_alone("conversion", bench, reps=1)
