"""The benchmark stage's `maxtext` backend, in MaxText's process: lm-evaluation-harness's tasks on
each model through MaxText's own inference engine (stages/in_maxtext/engine.py), from the
pipeline's MaxText checkpoints, and each model's greedy answers to `benchmark.prompts`.

    python -m stages.in_maxtext.main stages.in_maxtext.engine_benchmark --setup '{...}' \
        --request '<contract.EngineBenchmark: the models, the task files, the prompts, the report>' \
        -- <base.yml and MaxText's flags: the model, its dtype (stages/lib/flags.py)>

`EngineLM` is an lm-eval model (its `TemplateLM`: the harness builds every request, this
answers them), written to read text exactly as lm-eval's transformers backend (`HFLM`) does,
so that the two backends' scores compare: the same tokenizer and chat template (the base
checkpoint's), BOS added unless the text already starts with it, contexts cut on the left to
`max_length` less the answer's cap, answers cut at the task's stop strings and the tokenizer's
end of sequence, log-likelihoods of continuations split from their context as
`TemplateLM._encode_pair` splits them. It generates greedily unless a task asks to sample
(`do_sample` with a `temperature`). One engine serves both models: the second reuses every
program compiled for the first (tests/test_benchmark.py holds the scores and answers equal to
the transformers backend's on the tiny model; docs/benchmarks.md has the real 270M's).

The report, per model: lm-eval's results and logged samples per task, the greedy answers, and
where the engine's time went (loading, prefill, decode, scoring; tokens).
"""

import json
import os
import time

from lm_eval.api.model import TemplateLM

from stages.in_maxtext.engine import Engine, Sampling
from stages.in_maxtext.engine_answers import answer, stop_ids
from stages.shared import contract
from stages.shared.turns import UNFINISHED, conversation

REQUEST = contract.EngineBenchmark
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default for a task that names no cap (HFLM.max_gen_toks)


class EngineLM(TemplateLM):
    """lm-eval's view of MaxText's engine with the parameters it has loaded."""

    def __init__(self, engine: Engine, tokenizer, model_dir: str, max_length: int):
        super().__init__()
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.max_length = max_length

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As HFLM.tok_encode: the tokenizer's own special tokens (Gemma's BOS), unless told
        otherwise or the text already starts with BOS (a chat template renders it)."""
        from lm_eval.models.utils import has_bos_prefix

        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            add_special_tokens = False
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(string, **kwargs)

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        found = self.engine.loglikelihoods([(ctx, cont) for _, ctx, cont in requests], self.max_length)
        for (pair, _, _), result in zip(requests, found, strict=True):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return found

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood in windows of max_length tokens, as HFLM computes it."""
        from lm_eval import utils

        windows, owners = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in map(
                utils.make_disjoint_window,
                utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((ctx, cont))
                owners.append(i)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owners, self.engine.loglikelihoods(windows, self.max_length), strict=True):
            totals[i] += logp
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """All requests of one generation setting decoded together; each answer cut at its
        stop strings (and EOS), at most its max_gen_toks tokens."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        eos = self.tokenizer.decode(self.eot_token_id, skip_special_tokens=False)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str | None] = [None] * len(requests)
        for members in groups.values():
            kwargs = normalize_gen_kwargs(dict(requests[members[0]].args[1]), DEFAULT_MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            cap = kwargs.pop("max_gen_toks")
            sampled = kwargs.get("do_sample") and kwargs.get("temperature", 0) > 0
            sampling = Sampling(temperature=float(kwargs["temperature"]) if sampled else 0.0)
            contexts = [self.tok_encode(requests[i].args[0])[-(self.max_length - cap) :] for i in members]
            stops = stop_ids(self.tokenizer, self.model_dir, until)
            for i, g in zip(
                members, self.engine.generate(contexts, [cap] * len(members), stops, sampling), strict=True
            ):
                text = self.tokenizer.decode(g.tokens, skip_special_tokens=True)
                out[i] = postprocess_generated_text(text, until, None)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out


def evaluate(lm: EngineLM, request: contract.EngineBenchmark, manager, who: str) -> tuple[dict, dict]:
    """Each task run by lm-eval on `lm` (its own chat-template setting), as the transformers
    backend runs them: lm-eval's results and its logged samples per task."""
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable

    results: dict = {}
    samples: dict = {}
    for task in request.tasks:
        started = time.monotonic()
        found = simple_evaluate(
            model=lm,
            tasks=[task["name"]],
            limit=request.limit,
            apply_chat_template=task["chat_template"],
            fewshot_as_multiturn=task["chat_template"],
            log_samples=True,
            bootstrap_iters=request.bootstrap_iters,
            task_manager=manager,
        )
        found = json.loads(json.dumps(found, default=handle_non_serializable))  # what lm-eval's CLI writes
        for key in ("results", "groups", "n-samples"):
            results.setdefault(key, {}).update(found.get(key, {}))
        # every sample of the run: a group's (MMLU's) are its subtasks'
        samples[task["name"]] = [s for logged in found.get("samples", {}).values() for s in logged]
        scored = found.get("results", {}).get(task["name"]) or found.get("groups", {}).get(task["name"]) or {}
        print(
            f"benchmark: {who}: {task['name']} done in {time.monotonic() - started:.0f} s (MaxText's engine): "
            f"{task['metric']} {scored.get(task['metric'])}",  # (in the log, should the run be cut short)
            flush=True,
        )
    return results, samples


def run(request: contract.EngineBenchmark, maxtext_flags: list[str], setup: contract.Setup) -> None:
    import logging

    import transformers
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    tokenizer = transformers.AutoTokenizer.from_pretrained(request.tokenizer)
    manager = TaskManager(include_path=request.task_dir, include_defaults=False)
    size = request.size
    engine = Engine(maxtext_flags, size.slots, size.max_prompt, size.max_answer)
    report = {}
    for name, checkpoint in request.models.items():
        print(f"benchmark: {name}: loading {checkpoint} into MaxText's engine", flush=True)
        before = dict(engine.timing.__dict__)
        engine.load(checkpoint)
        lm = EngineLM(engine, tokenizer, request.tokenizer, request.max_length)
        results, samples = evaluate(lm, request, manager, name)
        print(f"benchmark: {name}: greedy answers to {len(request.prompts)} prompts (MaxText's engine)", flush=True)
        said = answer(
            engine,
            tokenizer,
            request.tokenizer,
            [conversation(p) for p in request.prompts],
            request.max_new_tokens,
            request.end_of_turn,
            Sampling(),
        )
        timing = {k: v - before[k] for k, v in engine.timing.__dict__.items()}
        shown = [text if ended else f"{text} {UNFINISHED}" for text, ended, _ in said]
        report[name] = {"results": results, "samples": samples, "answers": shown, "timing": timing}
        print(f"benchmark: {name}: engine {json.dumps(timing)}", flush=True)
        report["memory"] = device_memory()
        with open(request.report + ".partial", "w") as f:  # what a killed run leaves: each model as it finished
            json.dump(report, f)
    os.replace(request.report + ".partial", request.report)


def device_memory() -> dict:
    """The chip's peak memory in arrays over the run (nothing on a CPU)."""
    import jax

    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
    return {"peak_gib": round(max(peaks) / 2**30, 2)} if peaks else {}
