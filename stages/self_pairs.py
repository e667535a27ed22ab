"""Stage self_pairs: preference pairs the SFT model answers itself, each answer checked by code.

    python -m stages.self_pairs

With `preference.self_pairs.enabled`, the SFT model (models/sft-maxtext) answers each prompt
the constraints stage held out of SFT (data/constraints/heldout.jsonl: a conversation whose last
user turn carries verifiable instructions) `samples` times, sampled at `temperature`, through
MaxText's inference engine (stages/in_maxtext/engine_answers.py: on the chip where there is
one, else this machine's CPU; tools.answers runs the same). Every answer is checked against
every instruction of its prompt (stages/lib/instructions.py: lm-eval's IFEval checkers for
IFEval's kinds). A pair is (an answer that passes, one that fails); where none fails, (the
transformed answer the constraints stage made, the conversation's original answer), which does
not obey; where none passes, (the transformed answer, an answer that fails, cut off at
max_new_tokens or not). Writes
  data/self-pairs/train.jsonl, eval.jsonl   UltraFeedback's shape (`chosen`, `rejected`
                                            {role, content} lists ending in the two answers):
                                            preference_data reads them as a local source
  metrics/self_pairs.json                   prompts, answers, how many passed each kind, pairs of
                                            each origin
Off, it writes a note in data/self-pairs/ (always the same bytes), as preference_data does.
"""

import collections
import json
import os
import random
import tempfile
from typing import NamedTuple

from stages.lib import benchmark_data, flags, hardware, instructions, maxtext_process, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import contract, families
from stages.shared.errors import StageFailed, UserError

METRICS = os.path.join("metrics", "self_pairs.json")
HELDOUT = os.path.join(paths.CONSTRAINTS, "heldout.jsonl")
OFF_TEXT = (
    "The SFT model's own preference pairs are off (`preference.self_pairs.enabled: false`): nothing here.\n"
    "Turn them on with preference.enabled and preference.self_pairs.enabled (docs/preference.md).\n"
)
EVAL_EVERY = 10  # every 10th pair is held out for evaluate's pair scores


class Answer(NamedTuple):
    text: str
    ended: bool  # within max_new_tokens, at the family's end of turn


def sample(params, prompts: list[dict], work: str) -> list[list[Answer]]:
    """Each prompt's `samples` answers by the SFT model, through MaxText's engine."""
    from stages.lib.answers import left_padding_tokenizer

    s = params.preference.self_pairs
    tokenizer = left_padding_tokenizer(paths.BASE_HF)
    conversations = os.path.join(work, "conversations.jsonl")
    with open(conversations, "w") as f:
        f.writelines(json.dumps({"messages": p["messages"]}) + "\n" for p in prompts)
    longest = max(
        len(tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, return_dict=True)["input_ids"])
        for p in prompts
    )
    out = os.path.join(work, "answers.jsonl")
    request = contract.EngineAnswers(
        models={"sft": os.path.abspath(paths.SFT_PARAMS)},
        tokenizer=os.path.abspath(paths.BASE_HF),
        conversations=conversations,
        out=out,
        samples=s["samples"],
        temperature=s["temperature"],
        seed=s["seed"],
        max_new_tokens=s["max_new_tokens"],
        end_of_turn=families.of(params.model.maxtext_name).END_OF_TURN,
        size=contract.EngineSize(slots=params.benchmark.batch_size, max_prompt=longest, max_answer=s["max_new_tokens"]),
    )
    maxtext_process.run(
        "self_pairs",
        flags.engine_answers(params, request, work),
        params,
        progress=maxtext_process.last_line("self_pairs", "answers: "),
    )
    with open(out) as f:
        return [[Answer(a["text"], a["ended"]) for a in json.loads(line)["answers"]] for line in f]


def pair(prompt: dict, said: list[Answer], rng: random.Random, passed: collections.Counter) -> tuple[dict | None, str]:
    """One pair for the prompt from its answers (None: none to make), and where its two sides
    came from. An answer that never ended its turn fails every check; its text (cut at
    max_new_tokens) can still be the side rejected: an answer that runs on is what the pair
    teaches against."""
    checks = prompt["instructions"]
    good, bad = [], []
    for answer in said:
        results = [answer.ended and instructions.follows(c["id"], c["args"], answer.text) for c in checks]
        for c, r in zip(checks, results, strict=True):
            passed[c["id"]] += r
        if all(results):
            good.append(answer.text)
        elif answer.text.strip():
            bad.append(answer.text)
    if good and bad:
        chosen, rejected, origin = rng.choice(good), rng.choice(bad), "sampled_pass_vs_fail"
    elif good and prompt["answer"] != prompt["original"]:  # all obeyed: the transformed answer, the conversation's own
        chosen, rejected, origin = prompt["answer"], prompt["original"], "transformed_vs_original"
    elif good:  # ... which the instructions did not change (keywords it already had): nothing to prefer
        return None, "no_pair"
    elif bad:
        chosen, rejected, origin = prompt["answer"], rng.choice(bad), "transformed_vs_sampled_fail"
    else:  # every answer empty: nothing the model said to reject
        return None, "no_pair"
    turn = prompt["messages"]
    row = {
        "chosen": [*turn, {"role": "assistant", "content": chosen}],
        "rejected": [*turn, {"role": "assistant", "content": rejected}],
    }
    return row, origin


def main() -> None:
    params = load()
    p = params.preference
    if not (p.enabled and p.self_pairs.enabled):
        with outputs.staged_dir(paths.SELF_PAIRS) as tmp:
            with open(os.path.join(tmp, paths.OFF_NOTE), "w") as f:
                f.write(OFF_TEXT)
        outputs.write_json(METRICS, {"self_pairs": {"enabled": False}})
        print(f"self_pairs: off; wrote a note in {paths.SELF_PAIRS}", flush=True)
        return
    hardware.check_present(params)
    with open(HELDOUT, encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    if not prompts:
        raise UserError(f"preference.self_pairs.enabled: {HELDOUT} holds no prompts: set constraints.heldout above 0")
    with tempfile.TemporaryDirectory(prefix="self_pairs-") as work:
        benchmark_data.nltk_data(work)  # IFEval's sentence model, offline
        said = sample(params, prompts, work)
    rng = random.Random(p.self_pairs["seed"])
    passed: collections.Counter = collections.Counter()
    asked = collections.Counter(c["id"] for prompt in prompts for c in prompt["instructions"])
    rows, origins = [], collections.Counter()
    for prompt, answers in zip(prompts, said, strict=True):
        row, origin = pair(prompt, answers, rng, passed)
        origins[origin] += 1
        if row is not None:
            rows.append(row)
    if not rows:
        raise StageFailed(
            f"no pairs from {len(prompts)} prompts: each answer the SFT model gave was empty, or obeyed where the "
            "conversation's own answer obeys too; raise preference.self_pairs.samples or constraints.heldout"
        )
    with outputs.staged_dir(paths.SELF_PAIRS) as tmp:
        splits = {"train": [r for i, r in enumerate(rows) if i % EVAL_EVERY], "eval": rows[::EVAL_EVERY]}
        for split, members in splits.items():
            with open(os.path.join(tmp, f"{split}.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in members)
    answers = sum(len(a) for a in said)
    report = {
        "enabled": True,
        "prompts": len(prompts),
        "answers": answers,
        "answers_ended": sum(a.ended for s in said for a in s),
        "pairs": dict(origins),
        "passed_per_kind": {k: round(passed[k] / (asked[k] * p.self_pairs["samples"]), 4) for k in sorted(asked)},
    }
    outputs.write_json(METRICS, {"self_pairs": report})
    print(
        f"self_pairs: {len(prompts)} prompts x {p.self_pairs['samples']} answers; pairs: "
        + ", ".join(f"{n} {o}" for o, n in sorted(origins.items()))
        + f"; wrote {paths.SELF_PAIRS}",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "self_pairs")
