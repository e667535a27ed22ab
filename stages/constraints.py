"""Stage constraints: instruction-following examples made from the recipe's own training
conversations, every one checked by code.

    python -m stages.constraints

For a `constraints.share` of the rows SFT trains on, a training conversation is taken up to one
of its user turns (the first, or a later one: a model must obey in a second turn too), one to
`constraints.max_instructions` verifiable instructions are added to that turn in this project's
own words (stages/lib/instructions.py: IFEval's kinds, case, start and end, quotation,
punctuation, formats, length, keywords, repeating the request, two answers; and ours, a
numbered list, a one-word answer, a fixed first word, an exact sentence count), and the
conversation's own answer to that turn, shortened to `constraints.max_answer_words`, is made
to obey each of them by code. Each example is kept only if its answer passes the checker of
every instruction it carries (lm-eval's IFEval checkers for IFEval's kinds); one that fails is
dropped and counted. Never IFEval's prompts: its own data is not read here, and the wording is
ours (tests/test_constraints.py holds that no 8-word run of an IFEval prompt reaches the data).

`constraints.heldout` more prompts, made the same way from other conversations, are held out
of SFT: the SFT model answers them itself, and its answers, checked by the same code, become
preference pairs (stages/self_pairs.py).

Writes (off, share 0 and heldout 0: two empty files and zero counts, always the same bytes, so
what follows keeps its cached results):
  data/constraints/train.jsonl    {"messages": [...]} rows, trained beside data/chat/train.jsonl
  data/constraints/train-checks.jsonl  line for line, the instructions each row's last answer obeys
  data/constraints/heldout.jsonl  {"messages": [... the constrained user turn], "instructions":
                                  [{"id", "args"}], "answer": the transformed answer, "original":
                                  the conversation's own (shortened)}
  metrics/constraints.json        rows made; per kind: kept, failed its check, not applicable
"""

import json
import os
import random
import tempfile

from stages.lib import benchmark_data, chat, instructions, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load

METRICS = os.path.join("metrics", "constraints.json")
TRAIN = os.path.join(paths.CONSTRAINTS, "train.jsonl")
HELDOUT = os.path.join(paths.CONSTRAINTS, "heldout.jsonl")
MAX_ATTEMPTS = 20  # conversations tried per example wanted, at most


def shortened(answer: str, max_words: int) -> str:
    """The answer's plain sentences (no markdown, no code) up to `max_words` words, whole
    sentences only."""
    text = instructions.plain(answer)
    if not text:
        return ""
    kept = []
    for s in instructions.sentences(text):
        if kept and instructions.count_words(" ".join([*kept, s])) > max_words:
            break
        kept.append(s)
    return " ".join(kept)


def turns_usable(messages: list[dict]) -> list[int]:
    """Indices of the user turns that have an answer after them."""
    return [i for i, m in enumerate(messages[:-1]) if m["role"] == "user" and messages[i + 1]["role"] == "assistant"]


def make_example(messages: list[dict], rng: random.Random, c: dict, counts: dict) -> dict | None:
    """One example from a conversation: the conversation up to a user turn, instructions added
    to it, its answer transformed; None where no usable turn, answer or instruction is found
    (or the answer fails a check: counted)."""
    choices = turns_usable(messages)
    if not choices:
        return None
    turn = rng.choice(choices)
    request = messages[turn]["content"].strip()
    answer = shortened(messages[turn + 1]["content"], c["max_answer_words"])
    if not answer or not instructions.english(answer):
        return None
    wanted = rng.randint(1, c["max_instructions"])
    chosen: list[str] = []
    for kind in rng.sample(sorted(instructions.KINDS), len(instructions.KINDS)):
        if len(chosen) == wanted:
            break
        if not any(instructions.conflicts(kind, other) for other in chosen):
            chosen.append(kind)
    chosen.sort(key=lambda k: instructions.KINDS[k].stage)
    done, transformed = [], answer
    for kind_id in chosen:
        kind = instructions.KINDS[kind_id]
        args = kind.draw(rng, transformed, request)
        if args is None:
            counts[kind_id]["not_applicable"] += 1
            continue
        transformed = kind.apply(transformed, args).strip()
        done.append((kind_id, args))
    if not done or not transformed:
        return None
    failed = [k for k, a in done if not instructions.follows(k, a, transformed)]
    for kind_id, _ in done:  # a kind that passed in a dropped example: dropped with it
        counts[kind_id]["failed" if kind_id in failed else ("dropped_with_another" if failed else "kept")] += 1
    if failed:
        return None
    asked = " ".join(instructions.phrase(instructions.KINDS[k], a, rng) for k, a in done)
    content = f"{request}\n\n{asked}" if rng.random() < 0.75 else f"{asked}\n\n{request}"
    return {
        "messages": [*messages[:turn], {"role": "user", "content": content}],
        "instructions": [{"id": k, "args": a} for k, a in done],
        "answer": transformed,
        "original": answer,
    }


def main() -> None:
    params = load()
    c = params.constraints
    rows = [value for _, value, bad in chat.read_rows(os.path.join(paths.DATA, "train.jsonl")) if not bad]
    want_train = round(c["share"] / (1 - c["share"]) * len(rows)) if c["share"] else 0
    want = want_train + c["heldout"]
    counts = {k: {"kept": 0, "failed": 0, "dropped_with_another": 0, "not_applicable": 0} for k in instructions.KINDS}
    made: list[dict] = []
    if want:
        with tempfile.TemporaryDirectory(prefix="constraints-") as work:
            benchmark_data.nltk_data(work)  # IFEval's sentence model, offline
            rng = random.Random(c["seed"])
            order = rng.sample(range(len(rows)), len(rows))  # each conversation used once at most
            tried = 0
            for i in order:
                if len(made) == want or tried >= MAX_ATTEMPTS * want:
                    break
                tried += 1
                example = make_example(rows[i]["messages"], rng, c, counts)
                if example is not None:
                    made.append(example)
    heldout, train = made[: c["heldout"]], made[c["heldout"] :]
    with outputs.staged_dir(paths.CONSTRAINTS) as tmp:
        with open(os.path.join(tmp, "train.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(
                json.dumps(
                    {"messages": e["messages"] + [{"role": "assistant", "content": e["answer"]}]}, ensure_ascii=False
                )
                + "\n"
                for e in train
            )
        with open(os.path.join(tmp, "train-checks.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"instructions": e["instructions"]}) + "\n" for e in train)
        with open(os.path.join(tmp, "heldout.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in heldout)
    report = {
        "train_rows": len(train),
        "heldout_rows": len(heldout),
        "wanted": want,
        "chat_rows": len(rows),
        "kinds": counts,
    }
    outputs.write_json(METRICS, {"constraints": report})
    if want and len(made) < want:
        print(
            f"constraints: made {len(made)} of the {want} examples wanted: the conversations ran out (each is used "
            "once; non-English answers and answers of code or tables are passed over)",
            flush=True,
        )
    failed = sum(v["failed"] for v in counts.values())
    print(
        f"constraints: {len(train)} training examples ({c['share']:.0%} of SFT's rows), {len(heldout)} held out for "
        f"preference pairs; {failed} instructions failed their check (examples dropped); wrote {paths.CONSTRAINTS}",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "constraints")
