"""Held-out loss of MaxText checkpoints, computed the way training computes it.

Run by the evaluate stage (through stages.lib.maxtext_main, like MaxText's entry points):

    python -m stages.lib.maxtext_main stages.lib.heldout -- --report R.json \
        --checkpoint base=models/base-maxtext/0/items --checkpoint fine_tuned=models/sft-maxtext \
        -- <MaxText SFT flags: model, tokenizer, max_target_length, packing, eval data>

For each checkpoint: MaxText's own SFT input pipeline over the whole eval file, once (same
tokenizer, chat template, completion-only masking and packing as training), and MaxText's
training loss function with dropout off. The loss is averaged over target tokens, not over
batches, so it does not depend on how the rows happened to pack.
"""

import argparse
import json
import math
import os
import sys

BATCH_KEYS = ("inputs", "inputs_position", "inputs_segmentation", "targets", "targets_position", "targets_segmentation")


def heldout_loss(maxtext_args: list[str], checkpoint: str) -> dict:
    import jax
    from flax import nnx
    from flax.core.spmd import logical_axis_rules
    from maxtext.configs import pyconfig
    from maxtext.input_pipeline import hf_data_processing
    from maxtext.trainers.pre_train.train import loss_fn
    from maxtext.utils import model_creation_utils
    from maxtext.utils.globals import MAXTEXT_CONFIGS_DIR

    argv = ["heldout", os.path.join(MAXTEXT_CONFIGS_DIR, "post_train", "sft.yml"), *maxtext_args,
            f"load_parameters_path={checkpoint}", "eval_interval=1", "eval_steps=-1"]
    config = pyconfig.initialize_pydantic(argv)
    model, mesh = model_creation_utils.from_pretrained(config)
    xent, weight = 0.0, 0
    with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
        batches = hf_data_processing.make_hf_eval_iterator(config, mesh, [jax.process_index()])

        @nnx.jit
        def step(model, batch):
            _, aux = loss_fn(model, config, batch, dropout_rng=None, params=None, is_train=False)
            return aux["xent_sum"], aux["total_weights"]

        for batch in batches:  # one pass: the eval iterator ends with the data
            s, w = step(model, {k: batch[k] for k in BATCH_KEYS})  # a fresh dict: loss_fn edits it
            xent, weight = xent + float(s), weight + int(w)
    loss = xent / max(weight, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "target_tokens": weight}


def main() -> None:
    from absl import flags

    flags.FLAGS(sys.argv[:1])  # Grain's data workers read absl flags, which MaxText's app.run would parse
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", required=True)
    parser.add_argument("--checkpoint", action="append", required=True, help="NAME=PATH, evaluated in order")
    ours = parser.parse_args(sys.argv[1:split])
    maxtext_args = sys.argv[split + 1 :]
    report = {}
    for spec in ours.checkpoint:
        name, path = spec.split("=", 1)
        report[name] = heldout_loss(maxtext_args, path)
        print(f"heldout: {name}: {report[name]}", flush=True)
    with open(ours.report, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
