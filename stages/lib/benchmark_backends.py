"""The benchmark stage's backends: what runs lm-eval's tasks on the base and the tuned model, and
makes both models' greedy answers to `benchmark.prompts`. One class each; the stage picks one by
name (`benchmark.backend`; `auto`: `chosen`) and reads the same three things back from any:

    results  {model: lm-eval's results, groups and n-samples}
    samples  {model: {task: lm-eval's logged samples}}
    said     {model: the greedy answers, in the prompts' order}

  hf       lm-eval's transformers backend in the stage's process, on the HF checkpoints (the
           base and the export): the CPU recipes
  vllm     `lm-eval run --model vllm` on a TPU VM's chips (vllm-tpu in .venv-vllm), on the HF
           checkpoints
  maxtext  MaxText's own inference engine, in a MaxText process
           (stages/in_maxtext/engine_benchmark.py), on the pipeline's MaxText checkpoints:
           no export, no torch, no vLLM; on the chip training ran on, or on a CPU

Which checkpoints a backend reads is `benchmark.checkpoints` (hf or maxtext): dvc.yaml
declares the benchmark stage's dependency on the tuned model by it, so that on a TPU VM without
torch the stage needs no export (docs/tpu-vm.md).
"""

import functools
import glob
import json
import logging
import os
import shlex
import subprocess
import sys
import time

from stages.lib import answers, flags, hardware, maxtext_process, paths
from stages.shared import contract, families
from stages.shared.errors import UserError
from stages.shared.turns import conversation

HF_MODELS = {"base": paths.BASE_HF, "fine_tuned": paths.SFT_HF}
MODEL_NAMES = tuple(HF_MODELS)
CHECKPOINTS_OF = {"hf": "hf", "vllm": "hf", "maxtext": "maxtext"}  # the checkpoints each backend reads
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's cap for a generating task that names none


@functools.cache
def tokenizer_of(model_dir: str):
    """The checkpoint's tokenizer, loaded once for everything the stage does with it (the greedy
    answers, lm-eval's backend, the answers' shares): a load of Gemma 3's 262,144 words takes
    seconds, a third of the tiny recipe's stage when it was loaded five times (docs/benchmarks.md).
    Padded on the left, as batched generation needs; lm-eval pads explicitly wherever it pads,
    and finds the pad token set as it would set it (stages/lib/answers.py)."""
    return answers.left_padding_tokenizer(model_dir)


def groups(tasks: list[dict]) -> dict[bool, list[dict]]:
    """Tasks by whether the chat template applies: lm-eval takes that per run, not per task."""
    out: dict[bool, list[dict]] = {}
    for t in tasks:
        out.setdefault(t["chat_template"], []).append(t)
    return out


def answer_cap(t: dict) -> int | None:
    """A generating task's cap on an answer's tokens as the stage runs it (None: it scores
    log-likelihoods)."""
    if t["cfg"].get("output_type") != "generate_until":
        return None
    return t["max_gen_toks"] or (t["cfg"].get("generation_kwargs") or {}).get("max_gen_toks") or DEFAULT_MAX_GEN_TOKS


class Transformers:
    """lm-eval's transformers backend on the host, one model loaded at a time, in float32."""

    name = "hf"
    where = "transformers on the host"

    # What one scoring batch's logits may take: a log-likelihood task (MMLU) makes lm-eval's
    # transformers backend hold the logits of every position, batch x length x vocabulary
    # floats, and a log-softmax copy of them (Gemma 3's 262,144 words: 1 GiB per 1,024 tokens
    # per row).
    SCORING_LOGITS_BYTES = 3 << 30

    @classmethod
    def scoring_batch(cls, batch_size: int, max_length: int, vocabulary: int) -> int:
        """The batch a log-likelihood task runs at: benchmark.batch_size, unless rows as long as
        benchmark.max_length would put its logits over SCORING_LOGITS_BYTES."""
        return max(1, min(batch_size, cls.SCORING_LOGITS_BYTES // (max_length * vocabulary * 4)))

    def run(self, params, tasks: list[dict], task_dir: str, work: str) -> tuple[dict, dict, dict]:
        """Each model loaded once for all its tasks and the greedy answers (lm-eval's notices
        kept out of the terminal; a line per model and task says where it is)."""
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        b = params.benchmark
        manager = TaskManager(include_path=os.path.abspath(task_dir), include_defaults=False)
        results: dict[str, dict] = {who: {} for who in HF_MODELS}
        samples: dict[str, dict] = {who: {} for who in HF_MODELS}
        said: dict[str, list[str]] = {}
        for who, model_dir in HF_MODELS.items():
            # float32 whatever the checkpoint holds: a host CPU computes bf16 (the exports' dtype)
            # without native support, ~2.5x slower than float32 here; both models then compute alike.
            # (The small recipe's stage, alone on 2 cores: 208 -> 147 s, the same scores; 2026-12-06.)
            # Twice bf16's memory, one model at a time: docs/benchmarks.md, "Benchmarks".
            model = families.language_model(model_dir, params.model.maxtext_name, torch.float32)
            tokenizer = tokenizer_of(model_dir)
            print(f"benchmark: {who}: greedy answers to {len(b['prompts'])} prompts (transformers)", flush=True)
            said[who] = answers.greedy_answers(
                model, tokenizer, b["prompts"], b["max_new_tokens"], families.of(params.model.maxtext_name).END_OF_TURN
            )
            batches = {
                "generate": b["batch_size"],
                "score": self.scoring_batch(b["batch_size"], b["max_length"], model.config.vocab_size),
            }
            lms = {
                kind: HFLM(
                    pretrained=model, tokenizer=tokenizer, batch_size=n, max_length=b["max_length"], device="cpu"
                )
                for kind, n in batches.items()
            }
            for t in tasks:  # one run per task: each its own chat-template setting
                kind = "generate" if answer_cap(t) else "score"
                started = time.monotonic()
                found = simple_evaluate(
                    model=lms[kind],
                    tasks=[t["name"]],
                    limit=b["limit"],
                    apply_chat_template=t["chat_template"],
                    fewshot_as_multiturn=t["chat_template"],
                    log_samples=True,
                    bootstrap_iters=b["bootstrap_iters"],
                    task_manager=manager,
                )
                for key in ("results", "groups", "n-samples"):
                    results[who].setdefault(key, {}).update(found.get(key, {}))
                # every sample of the run: a group's (MMLU's) are its subtasks'
                samples[who][t["name"]] = [s for logged in found.get("samples", {}).values() for s in logged]
                print(
                    f"benchmark: {who}: {t['name']} done in {time.monotonic() - started:.0f} s (lm-eval, transformers "
                    f"backend, batches of {batches[kind]})",
                    flush=True,
                )
            del lms, model
        return results, samples, said


class VLLM:
    """`lm-eval run --model vllm` per model and chat-template setting, tensor-parallel over the
    host's chips, in vllm-tpu's own environment (runtime.lm_eval_python)."""

    name = "vllm"
    where = "vLLM on the chips"

    @staticmethod
    def python(params) -> str:
        """The interpreter of the vLLM runs: .venv-vllm, vllm-tpu's own locked set (requirements/vllm-tpu.in)."""
        return params.runtime.lm_eval_python or sys.executable

    def commands(self, params, tasks: list[dict], task_dir: str, out_dir: str) -> list[tuple[str, list[str]]]:
        """(model, argv) of each run: one per model and chat-template setting, samples logged
        (the answer shares). The greedy answers are tasks of the chat-template run, on the
        model vLLM has loaded anyway."""
        b = params.benchmark
        tpu = hardware.TPUS.get(params.hardware.kind)
        chips = tpu.chips_per_host if tpu else 1
        python = self.python(params)
        answer_tasks = [
            os.path.basename(f)[: -len(".yaml")]
            for f in answers.write_tasks(b["prompts"], b["max_new_tokens"], task_dir)
        ]
        runs = {chat: [t["name"] for t in members] for chat, members in groups(tasks).items()}
        runs.setdefault(True, []).extend(answer_tasks)
        commands = []
        for who, model_dir in HF_MODELS.items():
            for chat, files in runs.items():
                argv = [python, "-m", "lm_eval", "run", "--model", "vllm"]
                model_args = {
                    "pretrained": os.path.abspath(model_dir),
                    "tensor_parallel_size": chips,
                    "dtype": "bfloat16",
                    "max_model_len": b["max_length"],
                }
                argv += ["--model_args", ",".join(f"{k}={v}" for k, v in model_args.items())]
                # The stage's definitions, by name: an include path takes precedence over lm-eval's own.
                argv += ["--include_path", os.path.abspath(task_dir), "--tasks", *files]
                argv += ["--batch_size", "auto", "--seed", "0"]
                argv += ["--log_samples"]  # (lm-eval's CLI takes no bootstrap_iters: it bootstraps 100,000 times)
                argv += [
                    "--output_path",
                    os.path.abspath(os.path.join(out_dir, f"{who}-{'chat' if chat else 'plain'}")),
                ]
                if b["limit"]:
                    argv += ["--limit", str(b["limit"])]
                if chat:
                    argv += ["--apply_chat_template", "--fewshot_as_multiturn"]
                commands.append((who, argv))
        return commands

    @staticmethod
    def samples_of(output_path: str, task: str) -> list[dict]:
        """What lm-eval logged for one task of a `--log_samples` run."""
        found = answers.samples_file(output_path, task)
        if not found:
            return []
        with open(found) as f:
            return [json.loads(line) for line in f if line.strip()]

    def run(self, params, tasks: list[dict], task_dir: str, work: str) -> tuple[dict, dict, dict]:
        b = params.benchmark
        python = self.python(params)
        if subprocess.run([python, "-c", "import lm_eval, vllm"], capture_output=True).returncode != 0:
            raise UserError(
                f"benchmark.backend vllm: {python} cannot import lm_eval and vllm; set runtime.lm_eval_python to an "
                'environment with vllm-tpu (docs/tpu-vm.md, "Benchmarks on the chips"), or benchmark.backend: maxtext'
            )
        results: dict[str, dict] = {who: {} for who in HF_MODELS}
        samples: dict[str, dict] = {who: {} for who in HF_MODELS}
        said: dict[str, list[str]] = {}
        for who, argv in self.commands(params, tasks, task_dir, os.path.join(work, "results")):
            print(f"benchmark: {who}: {shlex.join(argv)}", flush=True)
            subprocess.run(argv, check=True)  # NLTK_DATA (IFEval's sentence model) is in the environment
            output = argv[argv.index("--output_path") + 1]
            newest = max(glob.glob(os.path.join(output, "**", "results_*.json"), recursive=True), key=os.path.getmtime)
            with open(newest) as f:
                found = json.load(f)
            for key in ("results", "groups", "n-samples"):
                results[who].setdefault(key, {}).update(found.get(key, {}))
            for t in tasks:
                samples[who][t["name"]] = self.samples_of(output, t["name"]) or samples[who].get(t["name"], [])
            if "--apply_chat_template" in argv:
                tokenizer = tokenizer_of(HF_MODELS[who])
                said[who] = answers.from_samples(output, b["prompts"], b["limit"], tokenizer, b["max_new_tokens"])
        return results, samples, said


class MaxTextEngine:
    """MaxText's inference engine on the pipeline's MaxText checkpoints, in one MaxText process
    for both models (stages/in_maxtext/engine_benchmark.py); bf16 on a TPU, float32 on a CPU."""

    name = "maxtext"
    where = "MaxText's inference engine"

    @staticmethod
    def models() -> dict[str, str]:
        """The base as converted, and the trained parameters (preference-tuned where there are)."""
        return {"base": paths.BASE_MAXTEXT_PARAMS, "fine_tuned": paths.tuned_params()}

    @staticmethod
    def size(params, tasks: list[dict]) -> contract.EngineSize:
        """The engine's KV cache: benchmark.batch_size sequences, each a prompt and the longest
        answer any task (or the greedy answers) asks for, within benchmark.max_length."""
        b = params.benchmark
        caps = {t["name"]: answer_cap(t) for t in tasks if answer_cap(t)}
        longest = max([b["max_new_tokens"], *caps.values()])
        if b["max_length"] - longest < 1:
            which = max(caps, key=caps.get) if caps and max(caps.values()) == longest else "benchmark.max_new_tokens"
            raise UserError(
                f"benchmark.max_length {b['max_length']} leaves no room for a prompt beside the longest answer asked "
                f"for ({which}: {longest} tokens): raise benchmark.max_length"
            )
        return contract.EngineSize(slots=b["batch_size"], max_prompt=b["max_length"] - longest, max_answer=longest)

    def request(self, params, tasks: list[dict], task_dir: str, report: str) -> contract.EngineBenchmark:
        b = params.benchmark
        return contract.EngineBenchmark(
            models={who: os.path.abspath(path) for who, path in self.models().items()},
            tokenizer=os.path.abspath(paths.BASE_HF),
            task_dir=os.path.abspath(task_dir),
            tasks=[{"name": t["name"], "chat_template": t["chat_template"], "metric": t["metric"]} for t in tasks],
            limit=b["limit"],
            bootstrap_iters=b["bootstrap_iters"],
            max_length=b["max_length"],
            prompts=[p if isinstance(p, str) else conversation(p) for p in b["prompts"]],  # (plain dicts, as JSON)
            max_new_tokens=b["max_new_tokens"],
            end_of_turn=families.of(params.model.maxtext_name).END_OF_TURN,
            size=self.size(params, tasks),
            report=os.path.abspath(report),
        )

    def run(self, params, tasks: list[dict], task_dir: str, work: str) -> tuple[dict, dict, dict]:
        report = os.path.join(work, "engine.json")
        invocation = flags.engine_benchmark(params, self.request(params, tasks, task_dir, report), work)
        maxtext_process.run(
            "benchmark", invocation, params, progress=maxtext_process.last_line("benchmark", "benchmark: ")
        )
        with open(report) as f:
            found = json.load(f)
        for who in MODEL_NAMES:
            t = found[who]["timing"]
            tokens = t["generated_tokens"] / t["decode_s"] if t["decode_s"] else 0
            print(
                f"benchmark: {who}: engine: load {t['load_s']:.0f} s, prefill {t['prefill_s']:.0f} s "
                f"({t['prompt_tokens']} prompt tokens), decode {t['decode_s']:.0f} s ({t['generated_tokens']} tokens, "
                f"{tokens:.0f}/s), scoring {t['score_s']:.0f} s ({t['scored_rows']} rows)",
                flush=True,
            )
        if found.get("memory"):
            print(f"benchmark: engine: peak device memory {found['memory']['peak_gib']} GiB in arrays", flush=True)
        return (
            {who: found[who]["results"] for who in MODEL_NAMES},
            {who: found[who]["samples"] for who in MODEL_NAMES},
            {who: found[who]["answers"] for who in MODEL_NAMES},
        )


BACKENDS = {backend.name: backend for backend in (Transformers, VLLM, MaxTextEngine)}


def chosen(params):
    """The backend `benchmark.backend` names; `auto`: the one that reads `benchmark.checkpoints`
    where the stage runs (maxtext checkpoints: MaxText's engine; hf: transformers on a CPU,
    vLLM on a TPU)."""
    b = params.benchmark
    name = b.backend
    if name == "auto":
        name = "maxtext" if b.checkpoints == "maxtext" else ("hf" if hardware.on_cpu(params) else "vllm")
    return BACKENDS[name]()
