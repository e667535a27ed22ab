"""Stage base_model: the base Hugging Face checkpoint, materialised in models/base-hf/.

    python -m stages.base_model

Sources, chosen by `base_model.source`:
  tiny - a model of `model.maxtext_name`'s family built offline from `base_model.tiny_seed`
         (the family's build_tiny, stages/shared/families/): its real tokenizer, tiny dimensions.
  hub  - `base_model.repo_id` downloaded at the commit `base_model.revision`.
  gguf - a llama.cpp GGUF (`base_model.gguf_file`, or the file `base_model.gguf_package`
         assembles), pinned by `base_model.gguf_sha256`, dequantized into a float32
         checkpoint (stages/lib/gguf_source.py).
Either way the checkpoint is checked to be one MaxText can represent exactly before it is
published, so a wrong architecture fails here rather than after conversion.
"""

import os

from stages.lib import gguf_source, hardware, hub, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import families
from stages.shared.checkpoint import CheckpointError

OUT = paths.BASE_HF


def from_gguf(p: dict, model_name: str, out_dir: str) -> None:
    """The GGUF checked (one line, before any weight is read), then dequantized into out_dir.
    A package's file is assembled beside out_dir and removed after."""
    family = families.of(model_name)
    work = f"{out_dir}.gguf"
    os.makedirs(work, exist_ok=True)
    try:
        path = gguf_source.obtain(p, work)
        gguf_source.check(path, p, family)
        print(f"base_model: dequantizing {gguf_source.describe(p)} with transformers (about a minute)", flush=True)
        gguf_source.dequantize(path, out_dir, family)
    finally:
        outputs.remove(work)


def main() -> None:
    params = load()
    # Nothing is fetched for a recipe that cannot run on this machine.
    hardware.check_present(params)
    p = params.base_model
    if p["source"] == "hub":
        hub.check_access(p["repo_id"], p["revision"], "model")
        hardware.check_output_disk(OUT, 1.05 * hub.download_size(p["repo_id"], p["revision"]), "the base checkpoint")
    with outputs.staged_dir(OUT) as tmp:
        if p["source"] == "tiny":
            family = families.of(params.model.maxtext_name)
            print(f"base_model: building the tiny {family.NAME} (seed {p['tiny_seed']})", flush=True)
            family.build_tiny(tmp, seed=p["tiny_seed"])
        elif p["source"] == "gguf":
            from_gguf(p, params.model.maxtext_name, tmp)
        else:
            print(f"base_model: downloading {p['repo_id']}@{p['revision'][:12]}", flush=True)
            hub.download_model(p["repo_id"], p["revision"], tmp)
        try:
            families.check_convertible(tmp, params.model.maxtext_name)
        except CheckpointError as e:  # name the output, not the temporary directory
            raise CheckpointError(str(e).replace(tmp, OUT)) from None
    print(f"base_model: wrote {OUT}", flush=True)


if __name__ == "__main__":
    run(main, "base_model")
