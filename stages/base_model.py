"""Stage base_model: the base Hugging Face checkpoint, materialised in models/base-hf/.

    python -m stages.base_model

Sources, chosen by `base_model.source`:
  tiny - a model of `model.maxtext_name`'s family built offline from `base_model.tiny_seed`
         (the family's build_tiny, stages/lib/families/): its real tokenizer, tiny dimensions.
  hub  - `base_model.repo_id` downloaded at the commit `base_model.revision`.
Either way the checkpoint is checked to be one MaxText can represent exactly before it is
published, so a wrong architecture fails here rather than after conversion.
"""


from stages.lib import families, hardware, hub, outputs, paths
from stages.lib.checkpoint import CheckpointError
from stages.lib.cli import run
from stages.lib.params import load

OUT = paths.BASE_HF


def main() -> None:
    params = load()
    # Nothing is fetched for a recipe that cannot run on this machine.
    hardware.check_present(params)
    p = params["base_model"]
    if p["source"] == "hub":
        hub.check_access(p["repo_id"], p["revision"], "model")
        hardware.check_output_disk(OUT, 1.05 * hub.download_size(p["repo_id"], p["revision"]), "the base checkpoint")
    with outputs.staged_dir(OUT) as tmp:
        if p["source"] == "tiny":
            family = families.of(params["model"]["maxtext_name"])
            print(f"base_model: building the tiny {family.NAME} (seed {p['tiny_seed']})", flush=True)
            family.build_tiny(tmp, seed=p["tiny_seed"])
        else:
            print(f"base_model: downloading {p['repo_id']}@{p['revision'][:12]}", flush=True)
            hub.download_model(p["repo_id"], p["revision"], tmp)
        try:
            families.check_convertible(tmp, params["model"]["maxtext_name"])
        except CheckpointError as e:  # name the output, not the temporary directory
            raise CheckpointError(str(e).replace(tmp, OUT)) from None
    print(f"base_model: wrote {OUT}", flush=True)


if __name__ == "__main__":
    run(main, "base_model")
