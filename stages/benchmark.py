"""Stage benchmark: standard benchmarks of the base and the fine-tuned model, with a regression gate.

    python -m stages.benchmark
    python -m stages.benchmark --dry-run   # what the backend would run: vLLM's lm-eval commands, or MaxText's

lm-evaluation-harness (lm-eval) scores the base and the fine-tuned model on the recipe's
`benchmark.tasks`: each a task of lm-eval's own registry (ifeval, gsm8k, ...; a group such as
mmlu where its data is a package's) or of assets/benchmarks (local tasks in lm-eval's YAML
format, their data in the repository), with its few-shot count, the chat template or not,
the metric that is its score, and where its data comes from: a pinned Hub revision, or a
pinned package's file (`data`, stages/lib/benchmark_data.py: the same definitions on the
package's rows, `max_items` of them per task). Each task is run from a small YAML written here
that `include`s the task's own definition and sets only those, so the harness runs its task
as published; for a generating task in the chat template, the template's end-of-turn marker
also ends an answer and is cut from the scored text (`max_gen_toks` may cap its length).
Which checkpoints it scores (`benchmark.checkpoints`): `hf`, models/base-hf and the export
models/sft-hf; `maxtext`, the pipeline's own MaxText checkpoints, models/base-maxtext and the
trained parameters (no export needed: the whole loop on a TPU VM without torch). Which backend
runs lm-eval's requests (`benchmark.backend`, one class each in stages/lib/benchmark_backends.py):
  hf       lm-eval's transformers backend in this process, on the host (CPU recipes; the
           language model alone, no vision tower)
  vllm     `lm-eval run --model vllm` on the TPU VM's chips (vllm-tpu; docs/benchmarks.md says
           what that needs and what is not proven)
  maxtext  MaxText's own inference engine in a MaxText process, on the chip (or a CPU)
  auto     maxtext for maxtext checkpoints; for hf ones, hf on cpu and vllm on a TPU
On the same loaded models, both models' greedy answers to `benchmark.prompts`
(stages/lib/answers.py). Writes, the metrics first, so that a failed gate leaves its numbers
to read:
  metrics/benchmark.json  per task: base and fine_tuned with their standard errors (lm-eval's,
                          `benchmark.bootstrap_iters`), change, items; for generating tasks the
                          shares of answers that echo the prompt, loop, or end their turn
                          (DVC metrics: dvc exp show lists them)
  eval/benchmark.md       the same as a table
  eval/generations.md     the prompts and both models' answers
Then the gate (`benchmark.gate`): a task whose tuned score falls more than `max_drop` below the
base's, and by more than `stderrs` standard errors of the difference (the noise the scores
carry), or stays under `min_score`, fails the stage with one line naming it.
"""

import functools
import json
import math
import os
import shlex
import sys
import tempfile

import yaml

from stages.lib import (
    answers,
    benchmark_backends,
    benchmark_data,
    flags,
    gates,
    hardware,
    maxtext_process,
    outputs,
    paths,
)
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import families
from stages.shared.errors import UserError

METRICS = os.path.join("metrics", "benchmark.json")
TABLE = os.path.join("eval", "benchmark.md")
LOCAL_TASKS = os.path.join("assets", "benchmarks")


@functools.cache
def registry(local_dir: str | None = None):
    """lm-eval's task registry: its own ~15,000 task files (`local_dir` None: ~10 s to index,
    once per process), or the tasks of one directory alone."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=local_dir, include_defaults=False) if local_dir else TaskManager()


def _data_files(cfg: dict) -> list[str]:
    """The local files of a task's `dataset_kwargs.data_files` (a path, a list, or {split: path or list})."""
    files = (cfg.get("dataset_kwargs") or {}).get("data_files") or []
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        files = list(files.values())
    return [f for v in files for f in ([v] if isinstance(v, str) else v)]


def check_local_data(name: str, cfg: dict) -> None:
    """A local task's data files exist and hold one JSON object per line."""
    for path in _data_files(cfg):
        if not os.path.exists(path):
            raise UserError(
                f"benchmark task {name}: its data file {path} does not exist (assets/benchmarks/generate.py writes it)"
            )
        with open(path) as f:
            for number, line in enumerate(f, start=1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"benchmark task {name}: {path}:{number}: not JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise UserError(f"benchmark task {name}: {path}:{number}: not a JSON object")


def metric_keys(cfg: dict) -> list[str]:
    """The `metric,filter` keys lm-eval reports for a task config (a group's: its aggregates),
    in its own order."""
    if "group" in cfg:
        return [f"{m['metric']},{m.get('filter_list', 'none')}" for m in cfg.get("aggregate_metric_list") or []]
    filters = [f["name"] for f in cfg.get("filter_list") or []] or ["none"]
    return [f"{m['metric']},{f}" for m in cfg.get("metric_list") or [] for f in filters]


def stderr_key(metric: str) -> str:
    """lm-eval's key of a metric's standard error: `acc,none` -> `acc_stderr,none`."""
    name, _, kind = metric.partition(",")
    return f"{name}_stderr,{kind}"


def resolve(params: dict) -> list[dict]:
    """Each task of the recipe checked against its definition, in the first seconds, before any
    model loads: its registry entry, its metric, its data (local tasks: readable; Hub tasks: a
    pinned revision; package data: the pinned file, and a definition that needs nothing the
    file lacks). Returns one dict per task: its params, its lm-eval entry and definition, its
    metric, and what the stage's own YAML sets."""
    from lm_eval.tasks._yaml_loader import load_yaml  # how lm-eval 0.4.13 (pinned) reads a task file, its CLI too

    local = registry(os.path.abspath(LOCAL_TASKS)) if os.path.isdir(LOCAL_TASKS) else None
    resolved = []
    for i, t in enumerate(params.benchmark.tasks):
        where = f"benchmark.tasks[{i}] ({t['name']})"
        index = local.task_index if local and t["name"] in local.task_index else registry().task_index
        entry = index.get(t["name"])
        if entry is None:
            raise UserError(
                f"{where}: no such lm-eval task, in lm-eval's registry or in {LOCAL_TASKS}/ "
                "(`lm-eval ls tasks` lists lm-eval's)"
            )
        group = entry.kind.name == "GROUP"
        if entry.yaml_path is None or entry.kind.name not in ("TASK", "GROUP"):
            raise UserError(f"{where}: a {entry.kind.name.lower()}, not a task defined by one YAML file; name one task")
        if group and not t["data"]:
            raise UserError(f"{where}: a group, not a task: name one of its tasks, or give the group package data")
        cfg = load_yaml(str(entry.yaml_path), resolve_func=False)
        keys = metric_keys(cfg)
        metric = t["metric"] or (keys[0] if keys else None)
        if metric not in keys:
            raise UserError(f"{where}: metric {metric!r} is not one it reports; choose one of {', '.join(keys)}")
        leaf = cfg if not group else None
        on_hub = not group and cfg.get("dataset_path") not in ("json", "csv", "parquet", "text")
        if t["data"]:
            if t["revision"]:
                raise UserError(f"{where}: its data is a package's file (data); its revision must be null")
            benchmark_data.package_data.locate(t["data"], f"{where}.data")
            shots = t["num_fewshot"] if t["num_fewshot"] is not None else (leaf or {}).get("num_fewshot") or 0
            fewshot = (leaf or {}).get("fewshot_split")
            inline = ((leaf or {}).get("fewshot_config") or {}).get("samples")
            if shots and fewshot and fewshot != leaf.get("test_split") and not inline:
                raise UserError(
                    f"{where}: {shots}-shot examples come from its {fewshot} split, which a package file does not "
                    "hold: set num_fewshot: 0, or choose a task with its examples in its definition (gsm8k_cot)"
                )
        elif on_hub and not t["revision"]:
            raise UserError(
                f"{where}: its data is on the Hub ({cfg.get('dataset_path')}); set its revision to a 40-character "
                "commit, or give it a pinned package's file (data)"
            )
        elif not on_hub:
            if t["revision"]:
                raise UserError(
                    f"{where}: its data is local ({', '.join(_data_files(cfg))}); its revision must be null"
                )
            check_local_data(t["name"], cfg)
        if (t["max_items"] is not None) and not t["data"]:
            raise UserError(f"{where}: max_items selects rows of package data (data); use benchmark.limit otherwise")
        override = {"include": str(entry.yaml_path), "task": t["name"]}
        if t["num_fewshot"] is not None and not group:
            override["num_fewshot"] = t["num_fewshot"]
        if t["revision"]:
            override["dataset_kwargs"] = {**(cfg.get("dataset_kwargs") or {}), "revision": t["revision"]}
        resolved.append({**t, "metric": metric, "override": override, "entry": entry, "index": index, "cfg": cfg})
    return resolved


def task_file(task_dir: str, name: str) -> str:
    return os.path.abspath(os.path.join(task_dir, f"{name}.yaml"))


def generation(cfg: dict, t: dict, end_of_turn: str | None) -> dict | None:
    """A generating task's generation settings as run here (None: unchanged): in the chat
    template, the template's end-of-turn marker also ends an answer (lm-eval cuts each answer
    at its stop strings, so the scored text never ends in the marker); `max_gen_toks` caps it."""
    if cfg.get("output_type") != "generate_until":
        return None
    settings = dict(cfg.get("generation_kwargs") or {})
    changed = False
    if t["chat_template"] and end_of_turn and end_of_turn not in (settings.get("until") or []):
        settings["until"] = [*(settings.get("until") or []), end_of_turn]
        changed = True
    if t["max_gen_toks"] is not None:
        settings["max_gen_toks"] = t["max_gen_toks"]
        changed = True
    return settings if changed else None


def write_task_files(tasks: list[dict], task_dir: str, end_of_turn: str | None) -> dict[str, dict]:
    """The stage's YAML for each task (the task's own, included, with the recipe's settings),
    package data written beside it. Returns, per task with package data, the rows written
    per lm-eval task and those left out."""
    from lm_eval.tasks._yaml_loader import load_yaml

    os.makedirs(task_dir, exist_ok=True)
    written = {}
    for i, t in enumerate(tasks):
        where = f"benchmark.tasks[{i}] ({t['name']})"
        if t["data"]:
            prepared = benchmark_data.prepare(t["entry"], t["index"], t["data"], t["max_items"], task_dir, where)
            files = prepared.files
            written[t["name"]] = {"items": prepared.items, "skipped": prepared.skipped}
            if t["num_fewshot"] is not None:
                for name in prepared.items:
                    files[name]["num_fewshot"] = t["num_fewshot"]
        else:
            files = {t["name"]: dict(t["override"])}
        for name, content in files.items():
            if "include" in content:
                settings = generation(load_yaml(content["include"], resolve_func=False), t, end_of_turn)
                if settings is not None:
                    content["generation_kwargs"] = settings
            with open(task_file(task_dir, name), "w") as f:
                yaml.safe_dump(content, f, sort_keys=False)
    return written


def check_readable(tasks: list[dict], task_dir: str) -> None:
    """Each task, as the stage's files define it, loads and reads its first document (prompt,
    target, choices; a generating task scores an empty answer): one line naming the task and
    what it could not read, before any model loads."""
    manager = registry(os.path.abspath(task_dir))
    for i, t in enumerate(tasks):
        where = f"benchmark.tasks[{i}] ({t['name']})"
        try:
            for task in manager.load([t["name"]])["tasks"].values():
                doc = next(iter(task.eval_docs))
                task.doc_to_text(doc)
                task.doc_to_target(doc)
                if task.OUTPUT_TYPE == "multiple_choice":
                    task.doc_to_choice(doc)
                elif task.OUTPUT_TYPE == "generate_until":
                    task.process_results(doc, [""])
        except Exception as e:  # noqa: BLE001 - whatever lm-eval raises, said in one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"{where}: lm-eval cannot read its data ({type(e).__name__}: {first[:200]})") from None


def scores(tasks: list[dict], results: dict[str, dict], written: dict[str, dict]) -> dict:
    """Per task: each model's score and its standard error (None where lm-eval gives none:
    bootstrap_iters 0), the change, and the items scored (a group's: over its tasks)."""
    out = {}
    for t in tasks:
        entry = {}
        for who in benchmark_backends.MODEL_NAMES:
            found = results[who]["results"].get(t["name"]) or results[who].get("groups", {}).get(t["name"])
            stderr = found.get(stderr_key(t["metric"]))
            entry[who] = float(found[t["metric"]])
            entry[f"{who}_stderr"] = (
                float(stderr) if isinstance(stderr, int | float) and math.isfinite(stderr) else None
            )
        entry["change"] = entry["fine_tuned"] - entry["base"]
        counted = results["fine_tuned"].get("n-samples", {})
        leaves = written.get(t["name"], {}).get("items") or {t["name"]: None}
        entry["items"] = sum(int((counted.get(name) or {}).get("effective") or 0) for name in leaves)
        if t["name"] in written:
            entry["rows_skipped"] = len(written[t["name"]]["skipped"])
        out[t["name"]] = entry
    return out


def answer_shares(tasks: list[dict], samples: dict, tokenizer) -> dict:
    """For each generating task, each model's shares of answers that echo the prompt, loop,
    and end their turn (stages/lib/answers.py: `shares`)."""
    out = {}
    for t in tasks:
        if t["cfg"].get("output_type") != "generate_until":
            continue
        cap = benchmark_backends.answer_cap(t)
        out[t["name"]] = {
            who: answers.shares(samples[who].get(t["name"], []), tokenizer, cap)
            for who in benchmark_backends.MODEL_NAMES
        }
    return out


def _score(value: float, stderr: float | None) -> str:
    return f"{value:.4f} ± {stderr:.4f}" if stderr is not None else f"{value:.4f}"


def table(tasks: list[dict], found: dict, shares: dict, engine: str, gate: dict | None) -> str:
    lines = [
        "# Benchmarks: base vs fine-tuned",
        "",
        f"Written by the benchmark stage (`python -m stages.benchmark`), lm-eval's {engine} backend; ± one standard",
        "error, lm-eval's.",
        "",
        "| task | metric | few-shot | chat template | items | base | fine-tuned | change | gate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tasks:
        s, limits = found[t["name"]], (gate or {}).get(t["name"])
        rule = (", ".join(f"{k} {v}" for k, v in limits.items() if v is not None) if limits else "") or "off"
        shots = t["num_fewshot"] if t["num_fewshot"] is not None else "task's"
        chat = "yes" if t["chat_template"] else "no"
        lines.append(
            f"| {t['name']} | {t['metric']} | {shots} | {chat} | {s['items']}"
            f" | {_score(s['base'], s['base_stderr'])} | {_score(s['fine_tuned'], s['fine_tuned_stderr'])}"
            f" | {s['change']:+.4f} | {rule} |"
        )
    if shares:
        lines += [
            "",
            "What the answers of the generating tasks are like (stages/lib/answers.py, `shares`): the share that "
            "echoes the prompt, that loops, that ends its turn before the cap on generated tokens.",
            "",
            "| task | cap (tokens) | model | echo | loop | ends its turn |",
            "|---|---|---|---|---|---|",
        ]
        for t in tasks:
            for who, s in (shares.get(t["name"]) or {}).items():
                cap = t["max_gen_toks"] or "task's"
                lines.append(f"| {t['name']} | {cap} | {who} | {s['echo']:.3f} | {s['loop']:.3f} | {s['ended']:.3f} |")
    return "\n".join(lines) + "\n"


def prepare(params: dict, work: str) -> tuple[list[dict], dict, str]:
    """The tasks resolved, their files written (package data too), NLTK's sentence model in
    place: what every run needs before a model loads. Returns the tasks, the rows written per
    task with package data, and the task directory."""
    tasks = resolve(params)
    task_dir = os.path.join(work, "tasks")
    benchmark_data.nltk_data(work)
    end_of_turn = families.of(params.model.maxtext_name).END_OF_TURN
    written = write_task_files(tasks, task_dir, end_of_turn)
    return tasks, written, task_dir


def main() -> None:
    params = load()
    dry_run = "--dry-run" in sys.argv
    if not dry_run:
        hardware.check_present(params)
    backend = benchmark_backends.chosen(params)
    if dry_run:  # the files stay, so that the commands run as printed
        work = tempfile.mkdtemp(prefix="benchmark-dry-run-")
        tasks, _, task_dir = prepare(params, work)
        dry_run_of(backend, params, tasks, task_dir, work)
        return
    with tempfile.TemporaryDirectory(prefix="benchmark-") as work:
        tasks, written, task_dir = prepare(params, work)
        check_readable(tasks, task_dir)
        if backend.name == "maxtext":
            backend.size(params, tasks)  # the engine's sizes checked before any model loads
        results, samples, said = backend.run(params, tasks, task_dir, work)
    found = scores(tasks, results, written)
    shares = answer_shares(tasks, samples, benchmark_backends.tokenizer_of(paths.BASE_HF))
    for name, by_model in shares.items():
        found[name]["answers"] = by_model
    gate = params.benchmark.gate
    outputs.write_json(METRICS, {"benchmark": found})
    outputs.write_text(TABLE, table(tasks, found, shares, backend.where, gate))
    answers.write_generations(params.benchmark.prompts, said["base"], said["fine_tuned"], backend.where)
    for name, s in found.items():
        print(
            f"benchmark: {name}: base {_score(s['base'], s['base_stderr'])}, "
            f"fine-tuned {_score(s['fine_tuned'], s['fine_tuned_stderr'])} ({s['items']} items)",
            flush=True,
        )
    print(f"benchmark: wrote {METRICS}, {TABLE}, {answers.GENERATIONS}", flush=True)
    failures = gates.benchmark.failures(found, gate)
    if failures:
        raise gates.GateFailed("benchmark gate", failures, f"; the scores are in {METRICS}")


def dry_run_of(backend, params: dict, tasks: list[dict], task_dir: str, work: str) -> None:
    """What the backend would run, and the files it would read: the vLLM backend's `lm-eval run`
    commands (lm-eval's own parser reads them), or MaxText's command, validated by MaxText."""
    print(f"# the task definitions these commands name: {task_dir}", flush=True)
    print(f"# IFEval's sentence model, offline: export NLTK_DATA={os.environ['NLTK_DATA']}", flush=True)
    if backend.name == "vllm":
        for _, argv in backend.commands(params, tasks, task_dir, os.path.join(work, "results")):
            print(shlex.join(argv))
    elif backend.name == "maxtext":
        request = backend.request(params, tasks, task_dir, os.path.join(work, "engine.json"))
        maxtext_process.dry_run("benchmark", flags.engine_benchmark(params, request, work), params)
    else:
        print(f"# benchmark.backend {backend.name}: lm-eval's transformers backend, in this process")


if __name__ == "__main__":
    run(main, "benchmark")
