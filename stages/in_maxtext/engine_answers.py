"""Answers from MaxText's inference engine to conversations: `python -m tools.answers` on a
machine with a chip (greedy or sampled, several per conversation), and the benchmark stage's
greedy answers to `benchmark.prompts` (stages/in_maxtext/engine_benchmark.py calls `answer`).

    python -m stages.in_maxtext.main stages.in_maxtext.engine_answers --setup '{...}' \
        --request '<contract.EngineAnswers: the models, the conversations file, samples, ...>' \
        -- <base.yml and MaxText's flags: the model, its dtype (stages/lib/flags.py)>

Each conversation is rendered by the base checkpoint's chat template with the generation
prompt, as transformers renders it for the host's backend (stages/lib/answers.py), and an
answer ends at the family's end of turn or the tokenizer's end of sequence, at most
`max_new_tokens` tokens. The output: one line per conversation, its messages and, per model
and sample, the answer's text, whether it ended its turn, and its tokens.
"""

import json

from stages.in_maxtext.engine import Engine, Sampling
from stages.shared import contract
from stages.shared.turns import cut

REQUEST = contract.EngineAnswers


def stop_ids(tokenizer, model_dir: str, texts: list[str]) -> set[int]:
    """The tokens that end an answer, where transformers' generate ends it: the checkpoint's
    generation config's end-of-sequence tokens (Gemma 3's: EOS and <end_of_turn>), the
    tokenizer's EOS, and each of `texts` that is one token (the end of turn, a task's stop)."""
    import transformers

    ids = {tokenizer.eos_token_id}
    try:
        eos = transformers.GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids |= set(eos if isinstance(eos, list) else [eos])
    except OSError:  # no generation_config.json
        pass
    for text in texts:
        one = tokenizer.encode(text, add_special_tokens=False)
        if len(one) == 1:
            ids.add(one[0])
    return {i for i in ids if i is not None}


def render(tokenizer, messages: list[dict]) -> list[int]:
    """A conversation as the model is asked it: the chat template, with the generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(ids["input_ids"])


def answer(
    engine: Engine,
    tokenizer,
    model_dir: str,
    conversations: list[list[dict]],
    max_new_tokens: int,
    end_of_turn: str,
    sampling: Sampling,
) -> list[tuple[str, bool, int]]:
    """Each conversation's answer: its text up to its end of turn (as stages/lib/answers.py
    reads transformers' answers), whether it ended its turn, its tokens."""
    ids = [render(tokenizer, c) for c in conversations]
    stops = stop_ids(tokenizer, model_dir, [end_of_turn])
    ends = [end_of_turn, *(t for t in (tokenizer.eos_token, tokenizer.pad_token) if t)]
    out = []
    for g in engine.generate(ids, [max_new_tokens] * len(ids), stops, sampling):
        text = tokenizer.decode(g.tokens + ([tokenizer.eos_token_id] if g.ended else []), skip_special_tokens=False)
        out.append((cut(text, ends)[0], g.ended, len(g.tokens)))
    return out


def run(request: contract.EngineAnswers, maxtext_flags: list[str], setup: contract.Setup) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(request.tokenizer)
    with open(request.conversations) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    conversations = [row["messages"] for row in rows]
    size = request.size
    engine = Engine(maxtext_flags, size.slots, size.max_prompt, size.max_answer)
    said: list[list[dict]] = [[] for _ in rows]
    for name, checkpoint in request.models.items():
        engine.load(checkpoint)
        for sample in range(request.samples):
            sampling = Sampling(temperature=request.temperature, seed=request.seed + sample)
            found = answer(
                engine,
                tokenizer,
                request.tokenizer,
                conversations,
                request.max_new_tokens,
                request.end_of_turn,
                sampling,
            )
            for row, (text, ended, tokens) in zip(said, found, strict=True):
                row.append({"model": name, "sample": sample, "text": text, "ended": ended, "tokens": tokens})
        print(f"answers: {name}: {len(rows)} conversations x {request.samples} done", flush=True)
    with open(request.out, "w") as f:
        for row, answers in zip(rows, said, strict=True):
            f.write(json.dumps({**row, "answers": answers}, ensure_ascii=False) + "\n")
    print(f"answers: engine {json.dumps(engine.timing.__dict__)}", flush=True)
