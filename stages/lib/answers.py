"""Greedy answers of the base and the fine-tuned model to the recipe's `benchmark.prompts`,
side by side in eval/generations.md: made by the benchmark stage on the models it has loaded
anyway, so that no model is loaded or put on the chips a second time for them
(docs/benchmarks.md, "What convert_out and evaluate cost at 4B").

- transformers backend (CPU recipes): `greedy_answers` on the language model lm-eval scored,
  all prompts in one left-padded batch.
- vLLM backend (TPU recipes): a generate-until task of lm-eval's own format (`write_task`),
  run inside each model's `lm-eval run --model vllm` beside the benchmarks, its answers read
  back from the samples lm-eval logs (`from_samples`).

Both: each prompt one user turn of the model's chat template, greedy, at most
`benchmark.max_new_tokens` new tokens, ending at the model's end of turn.
"""

import glob
import json
import os

import yaml

from stages.lib import outputs

GENERATIONS = os.path.join("eval", "generations.md")
TASK = "pipeline_greedy_answers"  # the vLLM backend's task; not a name of lm-eval's registry


def left_padding_tokenizer(model_dir: str):
    """The checkpoint's tokenizer, padding on the left as batched generation needs."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token is None:  # Llama 3's has none; padding only fills, the mask hides it
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def greedy_answers(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """All prompts in one left-padded batch: a decode step reads the weights once for every
    prompt, not once per prompt (bench/generation.py measures it)."""
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


def write_task(prompts: list[str], max_new_tokens: int, task_dir: str) -> str:
    """The prompts as an lm-eval generate-until task (its data beside it); returns its file.
    `until` stays empty: lm-eval stops at the model's end-of-sequence token, vLLM at the
    generation config's. Its score (exact match against nothing) is never read."""
    os.makedirs(task_dir, exist_ok=True)
    data = os.path.abspath(os.path.join(task_dir, f"{TASK}.jsonl"))
    with open(data, "w") as f:
        for prompt in prompts:
            f.write(json.dumps({"prompt": prompt}) + "\n")
    task = {
        "task": TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "",
        "generation_kwargs": {"until": [], "do_sample": False, "max_gen_toks": max_new_tokens},
        "metric_list": [{"metric": "exact_match"}],
    }
    path = os.path.abspath(os.path.join(task_dir, f"{TASK}.yaml"))
    with open(path, "w") as f:
        yaml.safe_dump(task, f, sort_keys=False)
    return path


def from_samples(output_path: str, count: int, limit: int | None) -> list[str]:
    """The answers of one `lm-eval run --log_samples` (its samples file for the task), in the
    prompts' order. With `benchmark.limit` lm-eval answers only the first `limit` prompts."""
    found = glob.glob(os.path.join(output_path, "**", f"samples_{TASK}_*.jsonl"), recursive=True)
    answers = ["(not generated: no samples file)"] * count
    if found:
        with open(max(found, key=os.path.getmtime)) as f:
            for line in f:
                sample = json.loads(line)
                answers[sample["doc_id"]] = sample["resps"][0][0].strip()
    for i in range(limit or count, count):
        answers[i] = f"(not generated: benchmark.limit is {limit})"
    return answers


def write_generations(prompts: list[str], base: list[str], tuned: list[str], engine: str) -> None:
    lines = [
        "# Greedy generations: base vs fine-tuned",
        "",
        f"Written by the benchmark stage (`python -m stages.benchmark`) from `benchmark.prompts`, {engine}.",
        "",
    ]
    for i, (prompt, b, t) in enumerate(zip(prompts, base, tuned, strict=True), start=1):
        lines += [
            f"## {i}. {prompt}",
            "",
            "**base**",
            "",
            "> " + (b or "(nothing)").replace("\n", "\n> "),
            "",
            "**fine-tuned**",
            "",
            "> " + (t or "(nothing)").replace("\n", "\n> "),
            "",
        ]
    outputs.write_text(GENERATIONS, "\n".join(lines))
