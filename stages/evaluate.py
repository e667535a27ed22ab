"""Stage evaluate: is the fine-tuned model better than the base on held-out chats?

    python -m stages.evaluate

Held-out loss and perplexity of the base (models/base-maxtext) and the fine-tuned model
(models/sft-maxtext) on data/chat/eval.jsonl, computed by MaxText with the tokenizer, chat
template, completion-only masking and packing training used (stages/lib/heldout.py). Then
greedy generations for the recipe's `evaluate.prompts` from both HF checkpoints with
`transformers`, side by side. Writes
  metrics/eval.json      base / fine-tuned loss and perplexity (DVC metrics)
  eval/generations.md    the prompts and both models' answers
"""

import json
import os

from stages.lib import chat, gemma3, hardware, maxtext, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load

METRICS = os.path.join("metrics", "eval.json")
GENERATIONS = os.path.join("eval", "generations.md")


def heldout(params: dict) -> dict:
    report_path = os.path.join("logs", f".heldout-{os.getpid()}.json")
    args = ["--report", report_path,
            "--checkpoint", f"base={os.path.abspath(paths.BASE_MAXTEXT_PARAMS)}",
            "--checkpoint", f"fine_tuned={os.path.abspath(paths.SFT_PARAMS)}",
            "--"] + maxtext.common_args(params, paths.BASE_HF) + chat.maxtext_data_args(params) + [
            "base_output_directory=" + os.path.abspath(os.path.join(params["runtime"]["scratch_dir"], "evaluate")),
            "run_name=evaluate", "per_device_batch_size=1"]
    maxtext.run("evaluate", "stages.lib.heldout", args, params)
    try:
        with open(report_path) as f:
            return json.load(f)
    finally:
        outputs.remove(report_path)


def generate(model_dir: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    auto = transformers.AutoModelForImageTextToText if hasattr(config, "vision_config") else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(model_dir).eval()
    answers = []
    for prompt in prompts:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        answers.append(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return answers


def write_generations(prompts: list[str], base: list[str], tuned: list[str]) -> None:
    lines = ["# Greedy generations: base vs fine-tuned", "",
             "Written by the evaluate stage (`python -m stages.evaluate`) from `evaluate.prompts`.", ""]
    for i, (prompt, b, t) in enumerate(zip(prompts, base, tuned), start=1):
        lines += [f"## {i}. {prompt}", "", "**base**", "", "> " + (b or "(nothing)").replace("\n", "\n> "), "",
                  "**fine-tuned**", "", "> " + (t or "(nothing)").replace("\n", "\n> "), ""]
    outputs.write_text(GENERATIONS, "\n".join(lines))


def main() -> None:
    params = load()
    gemma3.check_convertible(paths.BASE_HF, params["model"]["maxtext_name"])
    hardware.check_present(params)
    e = params["evaluate"]
    losses = heldout(params)
    base, tuned = losses["base"], losses["fine_tuned"]
    print(f"evaluate: held-out loss: base {base['loss']:.4f}, fine-tuned {tuned['loss']:.4f}", flush=True)
    print(f"evaluate: generating {len(e['prompts'])} answers with each model", flush=True)
    write_generations(e["prompts"], generate(paths.BASE_HF, e["prompts"], e["max_new_tokens"]),
                      generate(paths.SFT_HF, e["prompts"], e["max_new_tokens"]))
    outputs.write_json(METRICS, {
        "base_loss": base["loss"], "base_perplexity": base["perplexity"],
        "fine_tuned_loss": tuned["loss"], "fine_tuned_perplexity": tuned["perplexity"],
        "eval_target_tokens": tuned["target_tokens"],
    })
    print(f"evaluate: wrote {METRICS}, {GENERATIONS}", flush=True)


if __name__ == "__main__":
    run(main, "evaluate")
