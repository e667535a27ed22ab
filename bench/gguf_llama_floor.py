"""The GGUF check's floor under llama.cpp: what an honest file's logits differ by, per type, when
llama.cpp itself reads it (stages/lib/gguf_llama.py) and computes on this CPU, against the HF
export in transformers, float32. The limits of `gguf.check` sit above these, far below a wrong
tensor or metadata value (tests/test_gguf_export.py's faults). A row per model and type.

    python -m bench.gguf_llama_floor                       # the three families' tiny models
    python -m bench.gguf_llama_floor models/base-hf gemma3-4b   # a real checkpoint (the 270M's)
"""

import os
import sys
import tempfile

from stages import export_gguf
from stages.lib import gguf_export
from stages.shared import families

LOOSE = {"max_kl": 1e9, "max_mean_kl": 1e9, "min_top1_agreement": 0.0, "tie_margin": 0.05}


def floor(model_dir: str, model_name: str, kinds=("f16", "bf16", "q8_0")) -> dict:
    import torch

    from stages.shared.prompts import fixed_prompts

    model = families.language_model(model_dir, model_name, torch.float32)
    tensors = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    _, prompts = fixed_prompts(model_dir)
    reference = export_gguf.next_token_logits(model, prompts)
    ends = export_gguf.expected_ends(model_dir, model_name)
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for kind in kinds:
            path = os.path.join(work, f"{kind}.gguf")
            gguf_export.write(path, kind, tensors, model.config, model_dir, model_name, "floor")
            figures, problems = export_gguf.check(path, reference, prompts, LOOSE, ends)
            out[kind] = {k: figures[k] for k in ("kl_max", "kl_mean", "top1_agreement")} | {"problems": problems}
            os.remove(path)
    return out


def main(argv: list[str]) -> None:
    if argv:
        targets = [(argv[0], argv[1])]
    else:
        from stages.shared.families import gemma3, llama3, qwen3

        targets = []
        for module, name in ((gemma3, "gemma3-4b"), (llama3, "llama3.1-8b"), (qwen3, "qwen3-8b")):
            directory = tempfile.mkdtemp(prefix=f"tiny-{name}-")
            module.build_tiny(directory, seed=0)
            targets.append((directory, name))
    print("| model | type | max KL | mean KL | top-1 agreement | other problems |")
    print("|---|---|---|---|---|---|")
    for directory, name in targets:
        for kind, f in floor(directory, name).items():
            print(
                f"| {name} ({os.path.basename(os.path.normpath(directory))}) | {kind} | {f['kl_max']:.2g} | "
                f"{f['kl_mean']:.2g} | {f['top1_agreement']:.4f} | {'; '.join(f['problems']) or 'none'} |",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
