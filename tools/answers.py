"""Answers of the run's models to your own prompts: greedy, or several samples each.

    python -m tools.answers PROMPTS.jsonl --out ANSWERS.jsonl
    python -m tools.answers PROMPTS.jsonl --out ANSWERS.jsonl --model both --samples 4 --temperature 0.8
    python -m tools.answers PROMPTS.jsonl --out ANSWERS.jsonl --backend maxtext --max-new-tokens 512

PROMPTS.jsonl holds one conversation a line, in the dataset's `messages` form (UltraChat's):
{"messages": [{"role": "user", "content": "..."}]}, a system message first if you like, earlier
turns too; the last message is the user's, and that is what the model answers. Every row is
checked before any model loads; a bad one stops the command with one line naming its row.

Each line of ANSWERS.jsonl is the input row as it was, plus "answers": one entry per model and
sample, {"model": "base" | "tuned", "sample": k, "text", "ended" (the answer ended its turn
before --max-new-tokens), "tokens"}. The tuned model is the run's result (the preference-tuned
one where preference tuning ran, else SFT's).

Where it runs (--backend, default auto): on a machine with a TPU chip, MaxText's own inference
engine on the run's MaxText checkpoints (models/base-maxtext, models/sft-maxtext: no export
needed), as the benchmark stage's maxtext backend runs it; elsewhere transformers on the HF
checkpoints (models/base-hf, models/sft-hf), on the CPU. Both render the conversation with the
base checkpoint's chat template, stop at the model family's end of turn, and sample from the
whole distribution at --temperature (0: greedy).
"""

import argparse
import json
import os
import sys
import tempfile

from stages.lib import chat, flags, hardware, maxtext_process, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import contract, families
from stages.shared.errors import UserError

MODELS = {"base": ["base"], "tuned": ["tuned"], "both": ["base", "tuned"]}


def read_prompts(path: str) -> list[dict]:
    """The file's rows, each checked: one line naming the first bad row and what is wrong."""
    if not os.path.isfile(path):
        raise UserError(f'{path}: no such file (one JSON object a line: {{"messages": [...]}})')
    rows = []
    for number, value, bad in chat.read_rows(path):
        bad = bad or chat.problem(value, last="user")
        if bad:
            raise UserError(f"{path}: row {number}: {bad}")
        rows.append(value)
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows


def checkpoints(backend: str, models: list[str]) -> dict[str, str]:
    """{model: checkpoint} for the backend, each present, or one line saying how to get it."""
    if backend == "maxtext":
        where = {"base": paths.BASE_MAXTEXT_PARAMS, "tuned": paths.tuned_params()}
        made_by = {"base": "convert_in", "tuned": "train"}
    else:
        where = {"base": paths.BASE_HF, "tuned": paths.SFT_HF}
        made_by = {"base": "base_model", "tuned": "convert_out"}
    for who in models:
        if not os.path.isdir(where[who]):
            raise UserError(
                f"{where[who]}: not there ({who} model, backend {backend}): run `dvc repro {made_by[who]}`, or "
                f"`dvc pull {made_by[who]}` for a run made elsewhere"
            )
    return {who: where[who] for who in models}


def on_engine(params, rows: list[dict], models: dict[str, str], args, tokenizer) -> list[list[dict]]:
    """The answers of MaxText's engine (stages/in_maxtext/engine_answers.py), one process for all models."""
    longest = max(
        len(tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, return_dict=True)["input_ids"])
        for r in rows
    )
    with tempfile.TemporaryDirectory(prefix="answers-") as work:
        conversations = os.path.join(work, "conversations.jsonl")
        with open(conversations, "w") as f:
            f.writelines(json.dumps({"messages": r["messages"]}) + "\n" for r in rows)
        out = os.path.join(work, "answers.jsonl")
        request = contract.EngineAnswers(
            models={who: os.path.abspath(path) for who, path in models.items()},
            tokenizer=os.path.abspath(paths.BASE_HF),
            conversations=conversations,
            out=out,
            samples=args.samples,
            temperature=args.temperature,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
            end_of_turn=families.of(params.model.maxtext_name).END_OF_TURN,
            size=contract.EngineSize(slots=args.batch, max_prompt=longest, max_answer=args.max_new_tokens),
        )
        maxtext_process.run(
            "answers",
            flags.engine_answers(params, request, work),
            params,
            progress=maxtext_process.last_line("answers", "answers: "),
        )
        with open(out) as f:
            found = [json.loads(line)["answers"] for line in f]
    return found


def on_host(params, rows: list[dict], models: dict[str, str], args) -> list[list[dict]]:
    """transformers' answers on this machine's CPU, one model at a time, in batches of --batch."""
    import torch

    from stages.lib import answers

    end_of_turn = families.of(params.model.maxtext_name).END_OF_TURN
    said: list[list[dict]] = [[] for _ in rows]
    for who, model_dir in models.items():
        model = families.language_model(model_dir, params.model.maxtext_name, torch.float32)
        tokenizer = answers.left_padding_tokenizer(model_dir)
        for sample in range(args.samples):
            for start in range(0, len(rows), args.batch):
                chunk = [r["messages"] for r in rows[start : start + args.batch]]
                found = answers.generate(
                    model, tokenizer, chunk, args.max_new_tokens, end_of_turn, args.temperature, args.seed + sample
                )
                for row, (text, ended, tokens) in zip(said[start:], found, strict=False):
                    row.append({"model": who, "sample": sample, "text": text, "ended": ended, "tokens": tokens})
        print(f"answers: {who}: {len(rows)} conversations x {args.samples} done", file=sys.stderr, flush=True)
        del model
    return said


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.answers", description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help='a JSON Lines file: {"messages": [...]} a line, the last message the user\'s')
    parser.add_argument("--out", required=True, help="where the answers go (JSON Lines)")
    parser.add_argument("--model", choices=sorted(MODELS), default="tuned", help="whose answers (default tuned)")
    parser.add_argument("--samples", type=int, default=1, help="answers per conversation and model (default 1)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else sampled")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="an answer's cap, in tokens (default 512)")
    parser.add_argument("--seed", type=int, default=0, help="the first sample's seed; sample k uses seed + k")
    parser.add_argument("--batch", type=int, default=None, help="answers at once (default benchmark.batch_size)")
    parser.add_argument(
        "--backend",
        choices=("auto", "maxtext", "hf"),
        default="auto",
        help="auto: MaxText's engine where a TPU chip is, else transformers on the CPU",
    )
    args = parser.parse_args()
    if (
        args.samples < 1
        or args.max_new_tokens < 1
        or args.temperature < 0
        or (args.batch is not None and args.batch < 1)
    ):
        raise UserError("--samples, --max-new-tokens and --batch must be at least 1, --temperature at least 0")
    if args.samples > 1 and args.temperature == 0:
        raise UserError("--samples above 1 needs --temperature above 0 (greedy answers are all the same)")
    params = load()
    rows = read_prompts(args.prompts)
    backend = args.backend if args.backend != "auto" else ("maxtext" if hardware.tpu_chips_present() else "hf")
    models = checkpoints(backend, MODELS[args.model])
    args.batch = args.batch or params.benchmark.batch_size
    print(f"answers: {len(rows)} conversations, {', '.join(models)} ({backend})", file=sys.stderr, flush=True)
    if backend == "maxtext":
        from stages.lib.answers import left_padding_tokenizer

        said = on_engine(params, rows, models, args, left_padding_tokenizer(paths.BASE_HF))
    else:
        said = on_host(params, rows, models, args)
    outputs.write_text(
        args.out,
        "".join(json.dumps({**r, "answers": a}, ensure_ascii=False) + "\n" for r, a in zip(rows, said, strict=True)),
    )
    ended = sum(a["ended"] for row in said for a in row)
    total = sum(len(row) for row in said)
    print(f"answers: wrote {args.out}: {total} answers, {ended} ended their turn", file=sys.stderr, flush=True)


if __name__ == "__main__":
    run(main, "answers")
