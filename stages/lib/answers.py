"""Greedy answers of the base and the fine-tuned model to the recipe's `benchmark.prompts`,
side by side in eval/generations.md: made by the benchmark stage on the models it has loaded
anyway, so that no model is loaded or put on the chips a second time for them
(docs/benchmarks.md, "What convert_out and evaluate cost at 4B"). A prompt is a user's
message, or a conversation ending in one (a second turn: the model answers in context).

- transformers backend (CPU recipes): `greedy_answers` on the language model lm-eval scored,
  all prompts in one left-padded batch.
- vLLM backend (TPU recipes): generate-until tasks of lm-eval's own format (`write_tasks`),
  run inside each model's `lm-eval run --model vllm` beside the benchmarks, their answers
  read back from the samples lm-eval logs (`from_samples`). A conversation's earlier turns are
  its task's few-shot examples, which lm-eval puts in the chat template as turns.

Both: in the model's chat template, greedy, at most `benchmark.max_new_tokens` new tokens,
ending at the model's end of turn.

And what a benchmark's answers are like (`shares`): how many echo the prompt, loop, or end
their turn before the cap on generated tokens; a score reads differently when the base model
"follows" an instruction by copying it (IFEval does not penalise that).
"""

import glob
import json
import os
import re

import yaml

from stages.lib import outputs
from stages.shared.turns import UNFINISHED, conversation, cut

GENERATIONS = os.path.join("eval", "generations.md")
TASK = "pipeline_greedy_answers"  # the vLLM backend's tasks; not names of lm-eval's registry
ECHO_WORDS = 10  # an answer repeating this many consecutive words of its prompt echoes it
LOOP_WORDS = 8  # ... and one in which a run of this many words comes back 3 times loops


def left_padding_tokenizer(model_dir: str):
    """The checkpoint's tokenizer, padding on the left as batched generation needs."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token is None:  # Llama 3's has none; padding only fills, the mask hides it
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def greedy_answers(model, tokenizer, prompts: list, max_new_tokens: int, end_of_turn: str) -> list[str]:
    """All prompts in one left-padded batch: a decode step reads the weights once for every
    prompt, not once per prompt (bench/generation.py measures it). Each answer ends at the
    template's end-of-turn marker (Gemma 3's is not a special token: decoding keeps it), cut
    from the text; one that never reached it says so (UNFINISHED)."""
    found = generate(model, tokenizer, prompts, max_new_tokens, end_of_turn)
    return [text if ended else f"{text} {UNFINISHED}" for text, ended, _ in found]


def generate(
    model, tokenizer, prompts: list, max_new_tokens: int, end_of_turn: str, temperature: float = 0.0, seed: int = 0
) -> list[tuple[str, bool, int]]:
    """Each prompt's answer in transformers, greedy (temperature 0) or drawn at `temperature`
    from the whole distribution (no top-k or top-p: as MaxText's engine samples, `weighted`):
    its text up to its end of turn, whether it ended its turn, its tokens."""
    import torch

    inputs = tokenizer.apply_chat_template(
        [conversation(p) for p in prompts],
        add_generation_prompt=True,
        padding=True,
        return_tensors="pt",
        return_dict=True,
    )
    sampling = {"do_sample": False}
    if temperature > 0:
        torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling)
    start = inputs["input_ids"].shape[1]
    ends = [end_of_turn, *(t for t in (tokenizer.eos_token, tokenizer.pad_token) if t)]
    found = []
    for row in out:
        answer, ended = cut(tokenizer.decode(row[start:], skip_special_tokens=False), ends)
        tokens = len(tokenizer(answer, add_special_tokens=False)["input_ids"]) if ended else max_new_tokens
        found.append((answer, ended, tokens))
    return found


def _task(name: str, data: str, max_new_tokens: int, turns: list[dict]) -> dict:
    task = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "",
        "generation_kwargs": {"until": [], "do_sample": False, "max_gen_toks": max_new_tokens},
        "metric_list": [{"metric": "exact_match"}],
    }
    if turns and turns[0]["role"] == "system":
        task["description"] = turns[0]["content"]  # lm-eval's system message
        turns = turns[1:]
    if turns:  # the earlier exchanges, as the few-shot examples lm-eval renders as turns
        samples = [
            {"prompt": q["content"], "answer": a["content"]} for q, a in zip(turns[::2], turns[1::2], strict=True)
        ]
        task["num_fewshot"] = len(samples)
        task["fewshot_config"] = {
            "sampler": "first_n",
            "samples": samples,
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{answer}}",
            "target_delimiter": "",
        }
    return task


def task_names(prompts: list) -> list[str]:
    """The vLLM backend's task of each prompt: the single-turn ones share one; a conversation
    has its own (its earlier turns are its task's examples)."""
    return [TASK if isinstance(p, str) else f"{TASK}_{i}" for i, p in enumerate(prompts)]


def write_tasks(prompts: list, max_new_tokens: int, task_dir: str) -> list[str]:
    """The prompts as lm-eval generate-until tasks (their data beside them); returns their
    files. `until` stays empty: lm-eval stops at the model's end-of-sequence token, vLLM at the
    generation config's. Their score (exact match against nothing) is never read."""
    os.makedirs(task_dir, exist_ok=True)
    docs: dict[str, list[dict]] = {}
    for name, prompt in zip(task_names(prompts), prompts, strict=True):
        messages = conversation(prompt)
        docs.setdefault(name, []).append({"prompt": messages[-1]["content"], "turns": messages[:-1]})
    files = []
    for name, rows in docs.items():
        data = os.path.abspath(os.path.join(task_dir, f"{name}.jsonl"))
        with open(data, "w") as f:
            f.writelines(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows)
        path = os.path.abspath(os.path.join(task_dir, f"{name}.yaml"))
        with open(path, "w") as f:
            yaml.safe_dump(_task(name, data, max_new_tokens, rows[0]["turns"]), f, sort_keys=False)
        files.append(path)
    return files


def samples_file(output_path: str, task: str) -> str | None:
    """The newest samples file lm-eval's `--log_samples` wrote for `task` (named
    samples_<task>_<date>.jsonl: a task whose name starts another's is told by the date)."""
    pattern = re.compile(rf"samples_{re.escape(task)}_\d{{4}}-\d\d-\d\dT.*\.jsonl")
    found = [
        path
        for path in glob.glob(os.path.join(output_path, "**", f"samples_{task}_*.jsonl"), recursive=True)
        if pattern.fullmatch(os.path.basename(path))
    ]
    return max(found, key=os.path.getmtime) if found else None


def from_samples(output_path: str, prompts: list, limit: int | None, tokenizer, max_new_tokens: int) -> list[str]:
    """The answers of one `lm-eval run --log_samples` (its samples file for each answers task),
    in the prompts' order. With `benchmark.limit` lm-eval answers only the first `limit`
    prompts of a task. The engine stopped at the end of turn and dropped it, so an answer of
    `max_new_tokens` tokens is one that never ended its turn: marked UNFINISHED, as
    greedy_answers marks it."""
    answers = ["(not generated: no samples file)"] * len(prompts)
    names = task_names(prompts)
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        positions.setdefault(name, []).append(i)
    for name, where in positions.items():
        found = samples_file(output_path, name)
        if found:
            with open(found) as f:
                for line in f:
                    sample = json.loads(line)
                    text = sample["resps"][0][0].strip()
                    ran_out = len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= max_new_tokens
                    answers[where[sample["doc_id"]]] = f"{text} {UNFINISHED}" if ran_out else text
        for i in where[limit or len(where) :]:
            answers[i] = f"(not generated: benchmark.limit is {limit})"
    return answers


def _words(text: str) -> list[str]:
    return text.lower().split()


def echoes(answer: str, prompt: str) -> bool:
    """Whether the answer repeats a run of ECHO_WORDS consecutive words of the prompt (all of a
    shorter prompt)."""
    said, asked = _words(answer), _words(prompt)
    n = min(ECHO_WORDS, len(asked))
    if not n:
        return False
    runs = {tuple(asked[i : i + n]) for i in range(len(asked) - n + 1)}
    return any(tuple(said[i : i + n]) in runs for i in range(len(said) - n + 1))


def loops(answer: str) -> bool:
    """Whether a run of LOOP_WORDS words comes back three times or more in the answer."""
    said = _words(answer)
    counts: dict[tuple, int] = {}
    for i in range(len(said) - LOOP_WORDS + 1):
        run = tuple(said[i : i + LOOP_WORDS])
        counts[run] = counts.get(run, 0) + 1
        if counts[run] >= 3:
            return True
    return False


def prompt_of(sample: dict) -> str:
    """The user's text of a logged sample: the task's prompt field where it has one (IFEval's
    `prompt`, GSM8K's `question`), else the whole context lm-eval built."""
    doc = sample.get("doc") or {}
    for key in ("prompt", "question", "instruction"):
        if isinstance(doc.get(key), str):
            return doc[key]
    return str(sample["arguments"][0][0] if sample.get("arguments") else "")


def shares(samples: list[dict], tokenizer, cap: int) -> dict:
    """Of a generating task's answers (lm-eval's logged samples): the shares that echo their
    prompt, that loop, and that end their turn before `cap` generated tokens (lm-eval cuts an
    answer at its stop strings: one shorter than the cap stopped by itself)."""
    by_doc = {s.get("doc_id", i): s for i, s in enumerate(samples)}  # one entry per filter: each answer once
    said = [(s["resps"][0][0] if s.get("resps") else "", prompt_of(s)) for s in by_doc.values()]
    if not said:
        return {"answers": 0, "echo": 0.0, "loop": 0.0, "ended": 0.0}
    ended = sum(len(tokenizer(a, add_special_tokens=False)["input_ids"]) < cap - 1 for a, _ in said)
    return {
        "answers": len(said),
        "echo": sum(echoes(a, p) for a, p in said) / len(said),
        "loop": sum(loops(a) for a, _ in said) / len(said),
        "ended": ended / len(said),
    }


def _quoted(text: str) -> str:
    return "> " + (text or "(nothing)").replace("\n", "\n> ")


def write_generations(prompts: list, base: list[str], tuned: list[str], engine: str) -> None:
    lines = [
        "# Greedy generations: base vs fine-tuned",
        "",
        f"Written by the benchmark stage (`python -m stages.benchmark`) from `benchmark.prompts`, {engine}.",
        "",
    ]
    for i, (prompt, b, t) in enumerate(zip(prompts, base, tuned, strict=True), start=1):
        messages = conversation(prompt)
        lines += [f"## {i}. {messages[-1]['content']}", ""]
        if len(messages) > 1:
            lines += ["After:", ""] + [f"- *{m['role']}*: {m['content']}" for m in messages[:-1]] + [""]
        lines += ["**base**", "", _quoted(b), "", "**fine-tuned**", "", _quoted(t), ""]
    outputs.write_text(GENERATIONS, "\n".join(lines))
