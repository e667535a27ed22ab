"""What the greedy generations cost, one prompt at a time against all prompts in one batch.

    python -m tools.recipe small && dvc repro base_model   # once: models/base-hf (the real 270M)
    python -m bench.generation                             # ~3 minutes on 2 cores
    python -m bench.generation --reps 3 --max-new-tokens 64

The greedy answers of the benchmark stage's transformers backend (stages/lib/answers.py; the
evaluate stage made them until 2026-12-03) on the base checkpoint, with the recipe's prompts,
in transformers, float32, greedy: (A) each prompt alone, as evaluate once ran them; (B) all
prompts in one left-padded batch, as they run now.
Alternating A B B A, so drift on a noisy machine falls on both. Prints the seconds of each,
their ratio, whether the answers are the same, and the seconds per decode step of each way:
what the projection to 4B in docs/benchmarks.md ("What convert_out and evaluate cost at 4B")
starts from.
"""

import argparse
import json
import statistics
import time

from stages.lib import paths
from stages.lib.params import load


def one_at_a_time(model, tokenizer, prompts: list, max_new_tokens: int, end_of_turn: str) -> list[str]:
    import torch

    from stages.lib.answers import conversation

    answers = []
    for prompt in prompts:
        inputs = tokenizer.apply_chat_template(
            conversation(prompt), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        said = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        answers.append(said.split(end_of_turn, 1)[0].strip())
    return answers


def main() -> None:

    from stages.lib.answers import greedy_answers, left_padding_tokenizer
    from stages.shared import families

    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int)
    args = parser.parse_args()
    params = load()
    prompts = list(params["benchmark"]["prompts"])
    max_new_tokens = args.max_new_tokens or params["benchmark"]["max_new_tokens"]
    name = params["model"]["maxtext_name"]
    model = families.language_model(paths.BASE_HF, name)
    tokenizer = left_padding_tokenizer(paths.BASE_HF)
    end_of_turn = families.of(name).END_OF_TURN
    greedy_answers(model, tokenizer, prompts[:1], 2, end_of_turn)  # warm-up: first allocations
    seconds = {"A": [], "B": []}
    answers = {}
    for way in ("A", "B", "B", "A") * args.reps:
        start = time.perf_counter()
        if way == "A":
            answers[way] = one_at_a_time(model, tokenizer, prompts, max_new_tokens, end_of_turn)
        else:  # the stage's own function, on the same loaded model
            answers[way] = greedy_answers(model, tokenizer, prompts, max_new_tokens, end_of_turn)
        seconds[way].append(time.perf_counter() - start)
    a, b = statistics.median(seconds["A"]), statistics.median(seconds["B"])
    steps = len(prompts) * max_new_tokens
    print(
        json.dumps(
            {
                "model": paths.BASE_HF,
                "prompts": len(prompts),
                "max_new_tokens": max_new_tokens,
                "one_at_a_time_s": [round(s, 2) for s in seconds["A"]],
                "batched_s": [round(s, 2) for s in seconds["B"]],
                "ratio_batched_over_one_at_a_time": round(b / a, 3),
                "one_at_a_time_s_per_decode_step": round(a / steps, 4),
                "batched_s_per_decode_step": round(b / max_new_tokens, 4),
                "same_answers": answers["A"] == answers["B"],
                "answers": answers,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
