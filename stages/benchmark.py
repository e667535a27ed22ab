"""Stage benchmark: standard benchmarks of the base and the fine-tuned model, with a regression gate.

    python -m stages.benchmark
    python -m stages.benchmark --dry-run   # print the lm-eval commands the TPU backend runs; lm-eval parses them

lm-evaluation-harness (lm-eval) scores models/base-hf and models/sft-hf on the recipe's
`benchmark.tasks`: each a task of lm-eval's own registry (ifeval, gsm8k, leaderboard_mmlu_pro,
...) or of assets/benchmarks (local tasks in lm-eval's YAML format, their data in the
repository), with its few-shot count, the chat template or not, the metric that is its score,
and for data on the Hub a pinned dataset revision. Each task is run from a small YAML written
here that `include`s the task's own definition and sets only those, so the harness runs its
task as published. Where it runs (`benchmark.backend`):
  hf    lm-eval's transformers backend in this process, on the host (CPU recipes; the language
        model alone, no vision tower)
  vllm  `lm-eval run --model vllm` on the TPU VM's chips (vllm-tpu; docs/benchmarks.md says what
        that needs and what is not proven)
  auto  hf on cpu, vllm on a TPU
On the same loaded models, both models' greedy answers to `benchmark.prompts`
(stages/lib/answers.py): on the chips with vLLM, not the host. Writes, the metrics first, so
that a failed gate leaves its numbers to read:
  metrics/benchmark.json  per task: base, fine_tuned, change (DVC metrics: dvc exp show lists them)
  eval/benchmark.md       the same as a table, with the metric, few-shot count and items
  eval/generations.md     the prompts and both models' answers
Then the gate (`benchmark.gate`): a task whose tuned score falls more than `max_drop` below the
base's, or stays under `min_score`, fails the stage with one line naming it.
"""

import functools
import glob
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile

import yaml

from stages.lib import answers, families, hardware, outputs, paths
from stages.lib.cli import run
from stages.lib.errors import StageFailed, UserError
from stages.lib.params import load

METRICS = os.path.join("metrics", "benchmark.json")
TABLE = os.path.join("eval", "benchmark.md")
LOCAL_TASKS = os.path.join("assets", "benchmarks")
MODELS = {"base": paths.BASE_HF, "fine_tuned": paths.SFT_HF}


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
    """The `metric,filter` keys lm-eval reports for a task config, in its own order."""
    filters = [f["name"] for f in cfg.get("filter_list") or []] or ["none"]
    return [f"{m['metric']},{f}" for m in cfg.get("metric_list") or [] for f in filters]


def resolve(params: dict) -> list[dict]:
    """Each task of the recipe checked against its definition, in the first seconds, before any
    model loads: its registry entry, its metric, its data (local tasks: readable; Hub tasks: a
    pinned revision). Returns one dict per task: name, definition file, metric, and what the
    stage's own YAML sets."""
    from lm_eval.tasks._yaml_loader import load_yaml  # how lm-eval 0.4.13 (pinned) reads a task file, its CLI too

    tasks = params["benchmark"]["tasks"]
    local = registry(os.path.abspath(LOCAL_TASKS)) if os.path.isdir(LOCAL_TASKS) else None
    resolved = []
    for i, t in enumerate(tasks):
        where = f"benchmark.tasks[{i}] ({t['name']})"
        entry = (local and local.task_index.get(t["name"])) or registry().task_index.get(t["name"])
        if entry is None:
            raise UserError(
                f"{where}: no such lm-eval task, in lm-eval's registry or in {LOCAL_TASKS}/ "
                "(`lm-eval ls tasks` lists lm-eval's; a group such as mmlu is not one task)"
            )
        if entry.yaml_path is None or entry.kind.name != "TASK":
            raise UserError(f"{where}: a {entry.kind.name.lower()}, not a task defined by one YAML file; name one task")
        cfg = load_yaml(str(entry.yaml_path), resolve_func=False)
        keys = metric_keys(cfg)
        metric = t["metric"] or (keys[0] if keys else None)
        if metric not in keys:
            raise UserError(f"{where}: metric {metric!r} is not one it reports; choose one of {', '.join(keys)}")
        on_hub = cfg.get("dataset_path") not in ("json", "csv", "parquet", "text")
        if on_hub and not t["revision"]:
            raise UserError(
                f"{where}: its data is on the Hub ({cfg.get('dataset_path')}); set its revision to a 40-character "
                "commit, so that scores compare across runs"
            )
        if not on_hub:
            if t["revision"]:
                raise UserError(
                    f"{where}: its data is local ({', '.join(_data_files(cfg))}); its revision must be null"
                )
            check_local_data(t["name"], cfg)
        override = {"include": str(entry.yaml_path), "task": t["name"]}
        if t["num_fewshot"] is not None:
            override["num_fewshot"] = t["num_fewshot"]
        if t["revision"]:
            override["dataset_kwargs"] = {**(cfg.get("dataset_kwargs") or {}), "revision": t["revision"]}
        resolved.append({**t, "metric": metric, "override": override})
    return resolved


def task_file(task_dir: str, task: dict) -> str:
    return os.path.abspath(os.path.join(task_dir, f"{task['name']}.yaml"))


def write_task_files(tasks: list[dict], task_dir: str) -> None:
    """The stage's YAML for each task (the task's own, included, with the recipe's settings)."""
    os.makedirs(task_dir, exist_ok=True)
    for t in tasks:
        with open(task_file(task_dir, t), "w") as f:
            yaml.safe_dump(t["override"], f, sort_keys=False)


def groups(tasks: list[dict]) -> dict[bool, list[dict]]:
    """Tasks by whether the chat template applies: lm-eval takes that per run, not per task."""
    out: dict[bool, list[dict]] = {}
    for t in tasks:
        out.setdefault(t["chat_template"], []).append(t)
    return out


def backend(params: dict) -> str:
    chosen = params["benchmark"]["backend"]
    if chosen == "auto":
        return "hf" if hardware.on_cpu(params) else "vllm"
    return chosen


def lm_eval_python(params: dict) -> str:
    """The interpreter of the vLLM runs: .venv-vllm, vllm-tpu's own locked set (requirements/vllm-tpu.in)."""
    return params["runtime"]["lm_eval_python"] or sys.executable


def vllm_commands(params: dict, tasks: list[dict], task_dir: str, out_dir: str) -> list[tuple[str, list[str]]]:
    """(model, argv) of each `lm-eval run --model vllm` the TPU backend runs: one per model and
    chat-template setting, tensor-parallel over this host's chips. The greedy answers are a
    task of the chat-template run (its samples logged), on the model vLLM has loaded anyway."""
    b = params["benchmark"]
    tpu = hardware.TPUS.get(params["hardware"]["kind"])
    chips = tpu.chips_per_host if tpu else 1
    python = lm_eval_python(params)
    answer_task = answers.write_task(b["prompts"], b["max_new_tokens"], task_dir)
    runs = {chat: [task_file(task_dir, t) for t in members] for chat, members in groups(tasks).items()}
    runs.setdefault(True, []).append(answer_task)
    commands = []
    for who, model_dir in MODELS.items():
        for chat, files in runs.items():
            argv = [python, "-m", "lm_eval", "run", "--model", "vllm"]
            model_args = {
                "pretrained": os.path.abspath(model_dir),
                "tensor_parallel_size": chips,
                "dtype": "bfloat16",
                "max_model_len": b["max_length"],
            }
            argv += ["--model_args", ",".join(f"{k}={v}" for k, v in model_args.items())]
            argv += ["--tasks", *files, "--batch_size", "auto", "--seed", "0"]
            argv += ["--output_path", os.path.abspath(os.path.join(out_dir, f"{who}-{'chat' if chat else 'plain'}"))]
            if b["limit"]:
                argv += ["--limit", str(b["limit"])]
            if chat:
                argv += ["--apply_chat_template", "--fewshot_as_multiturn", "--log_samples"]
            commands.append((who, argv))
    return commands


def run_vllm(params: dict, tasks: list[dict], task_dir: str, out_dir: str) -> tuple[dict, dict]:
    """Each model's results, and its greedy answers (from the chat-template run's samples)."""
    b = params["benchmark"]
    python = lm_eval_python(params)
    if subprocess.run([python, "-c", "import lm_eval, vllm"], capture_output=True).returncode != 0:
        raise UserError(
            f"benchmark.backend vllm: {python} cannot import lm_eval and vllm; set runtime.lm_eval_python to an "
            'environment with vllm-tpu (docs/tpu-vm.md, "Benchmarks on the chips"), or benchmark.backend: hf'
        )
    results: dict[str, dict] = {who: {} for who in MODELS}
    said: dict[str, list[str]] = {}
    for who, argv in vllm_commands(params, tasks, task_dir, out_dir):
        print(f"benchmark: {who}: {shlex.join(argv)}", flush=True)
        subprocess.run(argv, check=True)
        output = argv[argv.index("--output_path") + 1]
        newest = max(glob.glob(os.path.join(output, "**", "results_*.json"), recursive=True), key=os.path.getmtime)
        with open(newest) as f:
            found = json.load(f)
        results[who].update(found["results"])
        results[who].setdefault("n-samples", {}).update(found.get("n-samples", {}))
        if "--log_samples" in argv:
            said[who] = answers.from_samples(output, len(b["prompts"]), b["limit"])
    return results, said


def run_hf(params: dict, tasks: list[dict], task_dir: str) -> tuple[dict, dict]:
    """lm-eval's transformers backend on each model, loaded once for all its tasks and the
    greedy answers (its notices kept out of the terminal; a line per model and run says where
    it is). Returns each model's results and its answers."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    b = params["benchmark"]
    manager = registry(os.path.abspath(task_dir))  # the stage's own YAML files, which include the definitions
    results: dict[str, dict] = {who: {} for who in MODELS}
    said: dict[str, list[str]] = {}
    for who, model_dir in MODELS.items():
        model = families.language_model(model_dir, params["model"]["maxtext_name"])
        print(f"benchmark: {who}: greedy answers to {len(b['prompts'])} prompts (transformers)", flush=True)
        said[who] = answers.greedy_answers(
            model, answers.left_padding_tokenizer(model_dir), b["prompts"], b["max_new_tokens"]
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        lm = HFLM(
            pretrained=model, tokenizer=tokenizer, batch_size=b["batch_size"], max_length=b["max_length"], device="cpu"
        )
        for chat, members in groups(tasks).items():
            names = ", ".join(t["name"] for t in members)
            print(f"benchmark: {who}: {names} (lm-eval, transformers backend)", flush=True)
            found = simple_evaluate(
                model=lm,
                tasks=[task_file(task_dir, t) for t in members],
                limit=b["limit"],
                apply_chat_template=chat,
                fewshot_as_multiturn=chat,
                log_samples=False,
                bootstrap_iters=0,  # no standard errors: a point score per task is what the gate reads
                task_manager=manager,
            )
            results[who].update(found["results"])
            results[who].setdefault("n-samples", {}).update(found.get("n-samples", {}))
        del lm, model
    return results, said


def scores(tasks: list[dict], results: dict[str, dict]) -> dict:
    out = {}
    for t in tasks:
        base, tuned = (float(results[who][t["name"]][t["metric"]]) for who in MODELS)
        out[t["name"]] = {"base": base, "fine_tuned": tuned, "change": tuned - base}
    return out


def gate_failures(found: dict, gate: dict | None) -> list[str]:
    """One phrase per task past its limits (benchmark.gate): both scores and the limit."""
    failures = []
    for name, limits in (gate or {}).items():
        s = found[name]
        drop = s["base"] - s["fine_tuned"]
        if limits["max_drop"] is not None and drop > limits["max_drop"]:
            failures.append(
                f"{name}: fine-tuned {s['fine_tuned']:.4f} vs base {s['base']:.4f}, a fall of {drop:.4f},"
                f" more than benchmark.gate.{name}.max_drop {limits['max_drop']}"
            )
        if limits["min_score"] is not None and s["fine_tuned"] < limits["min_score"]:
            failures.append(
                f"{name}: fine-tuned {s['fine_tuned']:.4f} (base {s['base']:.4f}),"
                f" below benchmark.gate.{name}.min_score {limits['min_score']}"
            )
    return failures


def table(tasks: list[dict], found: dict, items: dict, engine: str, gate: dict | None) -> str:
    lines = [
        "# Benchmarks: base vs fine-tuned",
        "",
        f"Written by the benchmark stage (`python -m stages.benchmark`), lm-eval's {engine} backend.",
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
            f"| {t['name']} | {t['metric']} | {shots} | {chat} | {items.get(t['name'], '?')}"
            f" | {s['base']:.4f} | {s['fine_tuned']:.4f} | {s['change']:+.4f} | {rule} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    params = load()
    dry_run = "--dry-run" in sys.argv
    if not dry_run:
        hardware.check_present(params)
    tasks = resolve(params)
    engine = backend(params)
    if dry_run:  # the files stay, so that the commands run as printed
        work = tempfile.mkdtemp(prefix="benchmark-dry-run-")
        task_dir = os.path.join(work, "tasks")
        write_task_files(tasks, task_dir)
        print(f"# the task definitions these commands name: {task_dir}", flush=True)
        for _, argv in vllm_commands(params, tasks, task_dir, os.path.join(work, "results")):
            print(shlex.join(argv))
        return
    with tempfile.TemporaryDirectory(prefix="benchmark-") as work:
        task_dir = os.path.join(work, "tasks")
        write_task_files(tasks, task_dir)
        if engine == "hf":
            results, said = run_hf(params, tasks, task_dir)
        else:
            results, said = run_vllm(params, tasks, task_dir, os.path.join(work, "results"))
    found = scores(tasks, results)
    items = {t["name"]: results["fine_tuned"]["n-samples"].get(t["name"], {}).get("effective") for t in tasks}
    gate = params["benchmark"]["gate"]
    outputs.write_json(METRICS, {"benchmark": found})
    outputs.write_text(TABLE, table(tasks, found, items, engine, gate))
    where = "transformers on the host" if engine == "hf" else "vLLM on the chips"
    answers.write_generations(params["benchmark"]["prompts"], said["base"], said["fine_tuned"], where)
    for name, s in found.items():
        print(f"benchmark: {name}: base {s['base']:.4f}, fine-tuned {s['fine_tuned']:.4f}", flush=True)
    print(f"benchmark: wrote {METRICS}, {TABLE}, {answers.GENERATIONS}", flush=True)
    failures = gate_failures(found, gate)
    if failures:
        raise StageFailed(f"the benchmark gate failed ({'; '.join(failures)}); the scores are in {METRICS}")


if __name__ == "__main__":
    run(main, "benchmark")
