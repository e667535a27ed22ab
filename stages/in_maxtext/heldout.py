"""The evaluate stage's work, in one process: held-out loss of MaxText checkpoints, computed
the way training computes it, and, after preference tuning, each model's scores on the
held-out preference pairs.

Run by the evaluate stage (through stages.in_maxtext.main, like MaxText's entry points):

    python -m stages.in_maxtext.main stages.in_maxtext.heldout --setup '{...}' --request '<contract.HeldOut:
        the report; the checkpoints {"base": "models/base-maxtext/0/items", "fine_tuned": ...}; the pairs>' \
        -- <sft.yml and MaxText's flags: model, tokenizer, max_target_length, packing, eval data (stages/lib/flags.py)>

Held-out loss, for each checkpoint: MaxText's own SFT input pipeline over the whole eval
file, once (same tokenizer, chat template, completion-only masking, packing and batch size
as training), and MaxText's training loss function with dropout off, averaged over the
batches as Tunix averages its in-training evaluation: the number training's eval/loss
curve shows, which the evaluate stage takes instead wherever training computed it
(stages/evaluate.py).
Pair scores (the request's `pairs`, {"sft": ..., "preference_tuned": ...}, with train_dpo's
config and data flags in its `pairs_flags`): each pair's log-probability of its chosen and rejected answer under
each checkpoint, through MaxText's DPO input pipeline and Tunix's `compute_logps`, as
train_dpo scores them; `preference_scores` turns them into the models' own preference and
Tunix's reward against the first (the reference).
(The greedy answers are the benchmark stage's: stages/lib/answers.py.)
"""

import json
import math
import sys

from stages.shared import contract

REQUEST = contract.HeldOut
BATCH_KEYS = ("inputs", "inputs_position", "inputs_segmentation", "targets", "targets_position", "targets_segmentation")


def heldout_loss(maxtext_args: list[str], checkpoint: str) -> dict:
    import jax
    from flax import nnx
    from flax.core.spmd import logical_axis_rules
    from maxtext.configs import pyconfig
    from maxtext.input_pipeline import hf_data_processing
    from maxtext.trainers.pre_train.train import loss_fn
    from maxtext.utils import model_creation_utils

    argv = ["heldout", *maxtext_args, f"load_parameters_path={checkpoint}", "eval_interval=1", "eval_steps=-1"]
    config = pyconfig.initialize_pydantic(argv)
    model, mesh = model_creation_utils.from_pretrained(config)
    losses, weight = [], 0
    with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
        batches = hf_data_processing.make_hf_eval_iterator(config, mesh, [jax.process_index()])

        @nnx.jit
        def step(model, batch):
            loss, aux = loss_fn(model, config, batch, dropout_rng=None, params=None, is_train=False)
            return loss, aux["total_weights"]

        for batch in batches:  # one pass: the eval iterator ends with the data
            loss, w = step(model, {k: batch[k] for k in BATCH_KEYS})  # a fresh dict: loss_fn edits it
            losses.append(float(loss))
            weight += int(w)
    loss = sum(losses) / max(len(losses), 1)  # as Tunix averages its evaluation (eval/avg_loss)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "target_tokens": weight}


def pair_logps(maxtext_args: list[str], checkpoint: str) -> tuple[list[float], list[float]]:
    """Each held-out pair's summed log-probability of its chosen and of its rejected answer
    under the checkpoint: MaxText's DPO input pipeline (prompt left-padded, answers
    right-padded, as train_dpo reads them) and Tunix's `compute_logps` on the inputs its
    DPOTrainer builds (`_prepare_inputs`: the prompt with each answer, in one batch)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax.core.spmd import logical_axis_rules
    from maxtext.configs import pyconfig
    from maxtext.input_pipeline import hf_data_processing, tokenizer
    from maxtext.utils import model_creation_utils
    from tunix.rl import common
    from tunix.sft.dpo import dpo_trainer

    argv = ["pairs", *maxtext_args, f"load_parameters_path={checkpoint}", "eval_interval=1", "eval_steps=-1"]
    config = pyconfig.initialize_pydantic(argv)
    pad_id = tokenizer.build_tokenizer(config.tokenizer_path, config.tokenizer_type, False, False, None).pad_id
    model, mesh = model_creation_utils.from_pretrained(config, wrap_with_tunix_adapter=True, tokenizer_pad_id=pad_id)
    chosen, rejected = [], []
    with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
        for batch in hf_data_processing.make_hf_eval_iterator(config, mesh, [jax.process_index()]):
            real = np.asarray(batch["prompt_mask"]).sum(axis=1) > 0  # the last batch's filler rows have none
            prompt_ids = jnp.concatenate([batch["prompt_ids"]] * 2, axis=0)
            prompt_mask = jnp.concatenate([batch["prompt_mask"]] * 2, axis=0)
            completion_ids = jnp.concatenate([batch["chosen_ids"], batch["rejected_ids"]], axis=0)
            completion_mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], axis=0)
            input_ids = jnp.concatenate([prompt_ids, completion_ids], axis=1)
            mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
            if hasattr(model, "get_attention_mask"):
                attention_mask = model.get_attention_mask(input_ids, inputs_mask=mask)
            else:
                attention_mask = common.make_causal_attn_mask(mask)
            c, r = dpo_trainer.compute_logps(
                model,
                input_ids,
                common.build_positions_from_mask(mask),
                attention_mask,
                completion_ids.shape[1],
                completion_mask,
            )
            chosen += np.asarray(c)[real].tolist()
            rejected += np.asarray(r)[real].tolist()
    return chosen, rejected


def preference_scores(logps: dict, reference: str, algorithm: str, beta: float) -> dict:
    """Per model: how often it makes the chosen answer the likelier (`preference_accuracy`) and
    by how much on average (`logp_margin`, nats); and the reward train_dpo optimises, as Tunix
    computes it (`reward_accuracy`, `reward_margin`): DPO's beta x the log-ratio to `reference`,
    ORPO's weight x the log-probability itself (its `orpo_lambda` comes as `beta`)."""
    ref_c, ref_r = logps[reference]
    out = {}
    for name, (c, r) in logps.items():
        if algorithm == "dpo":
            rewards = [beta * ((a - ra) - (b - rb)) for a, b, ra, rb in zip(c, r, ref_c, ref_r, strict=True)]
        else:
            rewards = [beta * (a - b) for a, b in zip(c, r, strict=True)]
        out[name] = {
            "pairs": len(c),
            "preference_accuracy": sum(a > b for a, b in zip(c, r, strict=True)) / len(c),
            "logp_margin": sum(a - b for a, b in zip(c, r, strict=True)) / len(c),
            "reward_accuracy": sum(x > 0 for x in rewards) / len(rewards),
            "reward_margin": sum(rewards) / len(rewards),
        }
    return out


def run(request: contract.HeldOut, maxtext_flags: list[str], setup: contract.Setup) -> None:
    from absl import flags

    flags.FLAGS(sys.argv[:1])  # Grain's data workers read absl flags, which MaxText's app.run would parse
    report = {"loss": {}}
    if request.pairs:
        logps = {name: pair_logps(request.pairs_flags, path) for name, path in request.pairs.items()}
        reference = next(iter(request.pairs))
        report["pairs"] = preference_scores(logps, reference, request.algorithm, request.beta)
        print(f"evaluation: pairs: {report['pairs']}", flush=True)
    for name, path in request.checkpoints.items():
        report["loss"][name] = heldout_loss(maxtext_flags, path)
        print(f"evaluation: {name}: {report['loss'][name]}", flush=True)
    with open(request.report, "w") as f:
        json.dump(report, f, indent=2)
