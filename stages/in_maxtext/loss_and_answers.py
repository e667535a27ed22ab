"""The evaluate stage's work, in one process: held-out loss of MaxText checkpoints, computed
the way training computes it, and greedy answers of the HF checkpoints to fixed prompts.

Run by the evaluate stage (through stages.in_maxtext.main, like MaxText's entry points):

    python -m stages.in_maxtext.main stages.in_maxtext.loss_and_answers -- --report R.json \
        --checkpoint base=models/base-maxtext/0/items --checkpoint fine_tuned=models/sft-maxtext/params \
        --generate base=models/base-hf --generate fine_tuned=models/sft-hf --prompts P.json \
        --max-new-tokens 24 --model-name gemma3-4b \
        -- <sft.yml and MaxText's flags: model, tokenizer, max_target_length, packing, eval data (stages/lib/flags.py)>

Held-out loss, for each checkpoint: MaxText's own SFT input pipeline over the whole eval
file, once (same tokenizer, chat template, completion-only masking, packing and batch size
as training), and MaxText's training loss function with dropout off, averaged over the
batches as Tunix averages its in-training evaluation: the number training's eval/loss
curve shows, which the evaluate stage takes instead wherever training computed it
(stages/evaluate.py). Generations: `transformers`, greedy, each prompt as one user turn of
the chat template, all prompts in one batch, the language model alone (no vision tower).
(One process for both: MaxText imports transformers and torch anyway.)
"""

import argparse
import json
import math
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


def generate(model_dir: str, model_name: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy answers of the checkpoint's language model (no vision tower) to the prompts."""
    from stages.lib import families

    return greedy_answers(
        families.language_model(model_dir, model_name), left_padding_tokenizer(model_dir), prompts, max_new_tokens
    )


def left_padding_tokenizer(model_dir: str):
    """The checkpoint's tokenizer, padding on the left as batched generation needs."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token is None:  # Llama 3's has none; padding only fills, the mask hides it
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def greedy_answers(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """All prompts in one left-padded batch: a decode step reads the weights once for every
    prompt, not once per prompt (bench/generation.py measures it; docs/benchmarks.md, "What
    convert_out and evaluate cost at 4B", projects it)."""
    import torch

    inputs = tokenizer.apply_chat_template(
        [[{"role": "user", "content": p}] for p in prompts],
        add_generation_prompt=True,
        padding=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    start = inputs["input_ids"].shape[1]
    return [tokenizer.decode(row[start:], skip_special_tokens=True).strip() for row in out]


def main() -> None:
    from absl import flags

    flags.FLAGS(sys.argv[:1])  # Grain's data workers read absl flags, which MaxText's app.run would parse
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", required=True)
    parser.add_argument("--checkpoint", action="append", default=[], help="NAME=PATH, evaluated in order")
    parser.add_argument("--generate", action="append", default=[], help="NAME=HF_DIR, answering --prompts")
    parser.add_argument("--prompts", help="a JSON list of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model-name", help="MaxText's model_name (which family's layouts apply)")
    ours = parser.parse_args(sys.argv[1:split])
    maxtext_args = sys.argv[split + 1 :]
    report = {"loss": {}, "generations": {}}
    for spec in ours.checkpoint:
        name, path = spec.split("=", 1)
        report["loss"][name] = heldout_loss(maxtext_args, path)
        print(f"evaluation: {name}: {report['loss'][name]}", flush=True)
    if ours.generate:
        with open(ours.prompts) as f:
            prompts = json.load(f)
        for spec in ours.generate:
            name, path = spec.split("=", 1)
            report["generations"][name] = generate(path, ours.model_name, prompts, ours.max_new_tokens)
    with open(ours.report, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
