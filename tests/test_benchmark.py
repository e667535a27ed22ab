"""The benchmark stage (stages/benchmark.py): lm-evaluation-harness on both models, its metrics in
DVC, its gate; bad task settings stopped before any model loads; the TPU backend's commands as
lm-eval's own parser reads them. (The real model's scores: tests/test_small.py.)"""

import json
import shlex
import shutil
import sys

import pytest

from stages import benchmark
from stages.lib import answers
from stages.lib.errors import UserError
from stages.lib.params import load as load_params
from testkit.workspace import REPO, clone_workspace, set_param, sh, stages_run


def tasks(*entries: dict) -> dict:
    """A params dict holding just the benchmark tasks (what `resolve` reads)."""
    defaults = {"num_fewshot": None, "chat_template": True, "metric": None, "revision": None}
    return {"benchmark": {"tasks": [{**defaults, **e} for e in entries]}}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A directory holding a copy of assets/benchmarks, as the stage's working directory."""
    shutil.copytree(REPO / "assets" / "benchmarks", tmp_path / "assets" / "benchmarks")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_local_tasks_resolve_to_their_own_definitions(project):
    found = benchmark.resolve(tasks({"name": "chat_arithmetic", "num_fewshot": 2}, {"name": "chat_capitals"}))
    assert [t["metric"] for t in found] == ["exact_match,last-number", "acc,none"]  # each task's first metric
    assert found[0]["override"] == {
        "include": str(project / "assets" / "benchmarks" / "chat_arithmetic.yaml"),
        "task": "chat_arithmetic",
        "num_fewshot": 2,
    }
    assert "num_fewshot" not in found[1]["override"]  # null: the task's own count


@pytest.mark.parametrize(
    "entry, named",
    [
        ({"name": "chat_arithmetc"}, "benchmark.tasks[0] (chat_arithmetc): no such lm-eval task"),
        ({"name": "mmlu"}, "benchmark.tasks[0] (mmlu): a group, not a task"),
        ({"name": "gsm8k"}, "benchmark.tasks[0] (gsm8k): its data is on the Hub (openai/gsm8k); set its revision"),
        ({"name": "chat_capitals", "metric": "exact_match,none"}, "choose one of acc,none"),
        ({"name": "chat_capitals", "revision": "0" * 40}, "its data is local (assets/benchmarks/capitals.jsonl)"),
    ],
)
def test_a_bad_task_setting_is_one_line_naming_it(project, entry, named):
    with pytest.raises(UserError, match=None) as e:
        benchmark.resolve(tasks(entry))
    assert named in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_unreadable_local_data_is_named_by_file_and_line(project):
    data = project / "assets" / "benchmarks" / "capitals.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines[:2] + ['{"country": "Peru", "choices": [}'] + lines[3:]) + "\n")
    with pytest.raises(UserError, match=r"chat_capitals: assets/benchmarks/capitals.jsonl:3: not JSON"):
        benchmark.resolve(tasks({"name": "chat_capitals"}))
    data.unlink()
    with pytest.raises(UserError, match=r"capitals.jsonl does not exist"):
        benchmark.resolve(tasks({"name": "chat_capitals"}))


def test_the_gate_names_the_task_both_scores_and_the_limit():
    found = {
        "a": {"base": 0.50, "fine_tuned": 0.40, "change": -0.10},
        "b": {"base": 0.50, "fine_tuned": 0.49, "change": -0.01},
    }
    gate = {"a": {"max_drop": 0.05, "min_score": None}, "b": {"max_drop": 0.05, "min_score": 0.6}}
    assert benchmark.gate_failures(found, gate) == [
        "a: fine-tuned 0.4000 vs base 0.5000, a fall of 0.1000, more than benchmark.gate.a.max_drop 0.05",
        "b: fine-tuned 0.4900 (base 0.5000), below benchmark.gate.b.min_score 0.6",
    ]
    assert benchmark.gate_failures(found, {"a": {"max_drop": 0.2, "min_score": 0.4}}) == []  # at the limit: passes
    assert benchmark.gate_failures(found, None) == []


@pytest.mark.slow  # lm-eval indexes its ~15,000 task files twice (~40 s)
def test_the_tpu_backends_commands_are_what_lm_evals_own_parser_reads():
    """`--dry-run` on the committed 4B recipe: two `lm-eval run --model vllm` commands, which
    lm-eval's CLI parser and its configuration check accept, and whose task files lm-eval
    loads (each includes lm-eval's own definition, functions and all). The vLLM run itself
    needs a TPU VM: not run here (docs/benchmarks.md)."""
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig

    out = sh([sys.executable, "-m", "stages.benchmark", "--dry-run"], REPO).stdout.splitlines()
    commands = [shlex.split(line) for line in out if not line.startswith("#")]
    assert len(commands) == 2  # base and fine-tuned; every 4B task takes the chat template
    for argv, model in zip(commands, ("base-hf", "sft-hf"), strict=True):
        assert argv[1:4] == ["-m", "lm_eval", "run"]
        args = HarnessCLI()._parser.parse_args(argv[3:])
        assert (args.command, args.model) == ("run", "vllm") and args.apply_chat_template
        config = EvaluatorConfig.from_cli(args)
        assert config.model_args["pretrained"].endswith(f"models/{model}")
        assert config.model_args["tensor_parallel_size"] == 8  # the v6e-8's chips
        config.process_tasks()
        loaded = {t["task"]: t for t in config.tasks}
        assert set(loaded) == {"ifeval", "gsm8k", "leaderboard_mmlu_pro", answers.TASK}
        assert loaded["gsm8k"]["dataset_kwargs"]["revision"] == "740312add88f781978c0658806c59bc2815b9866"
        assert loaded["gsm8k"]["num_fewshot"] == 5 and callable(loaded["ifeval"]["process_results"])
        # the greedy answers, on the model vLLM loaded for the benchmarks, their samples logged
        said = loaded[answers.TASK]
        assert said["output_type"] == "generate_until" and args.log_samples
        assert said["generation_kwargs"] == {"until": [], "do_sample": False, "max_gen_toks": 200}
        data = said["dataset_kwargs"]["data_files"]["test"]
        assert [json.loads(line)["prompt"] for line in open(data)] == load_params(str(REPO / "params.yaml"))[
            "benchmark"
        ]["prompts"]


@pytest.mark.slow
def test_the_vllm_backends_answers_task_answers_as_the_transformers_backend(tiny_base, tmp_path):
    """The greedy answers' task that the vLLM backend runs, run here by the same `lm-eval run`
    with the transformers model instead of vllm (lm-eval's own CLI, chat template, logged
    samples), on the tiny base: the same answers as the transformers backend's own batch
    (stages/lib/answers.py), and `benchmark.limit` named where lm-eval stopped short."""
    from stages.lib import families

    prompts = ["What is 17 plus 25?", "What is the capital of Peru?", "Spell the word tiger backwards."]
    task = answers.write_task(prompts, 12, str(tmp_path / "tasks"))
    out = tmp_path / "results"
    argv = [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", f"pretrained={tiny_base}"]
    argv += ["--tasks", task, "--batch_size", "4", "--seed", "0", "--output_path", str(out), "--limit", "2"]
    sh([*argv, "--apply_chat_template", "--fewshot_as_multiturn", "--log_samples"], tmp_path)
    found = answers.from_samples(str(out), len(prompts), 2)
    model = families.language_model(str(tiny_base), "gemma3-4b")
    expected = answers.greedy_answers(model, answers.left_padding_tokenizer(str(tiny_base)), prompts[:2], 12)
    assert found == [*expected, "(not generated: benchmark.limit is 2)"]
    assert all(expected), expected  # a random model's 12 tokens: never nothing


@pytest.mark.slow
def test_benchmarks_land_in_dvc_metrics_rerun_alone_and_gate(tiny_run, tmp_path):
    """On the tiny run: both models scored on the local tasks, listed by `dvc exp show`; a
    benchmark param re-runs the benchmark stage alone; a limit no model can meet fails the
    stage with one line naming the task, both scores and the limit, its metrics written."""
    shown = json.loads((tiny_run.path / "metrics" / "benchmark.json").read_text())["benchmark"]
    assert set(shown) == {"chat_arithmetic", "chat_capitals"}
    for s in shown.values():
        assert 0 <= s["base"] <= 1 and 0 <= s["fine_tuned"] <= 1 and s["change"] == s["fine_tuned"] - s["base"]
    table = (tiny_run.path / "eval" / "benchmark.md").read_text()
    assert "| chat_arithmetic | exact_match,last-number | 0 | yes | 8 |" in table

    root = clone_workspace(tiny_run, tmp_path)
    proc = sh(["dvc", "exp", "run", "-n", "quick", "-S", "benchmark.limit=4"], root)
    assert stages_run(proc.stdout) == ["benchmark"], proc.stdout[-2000:]
    rows = json.loads(sh(["dvc", "exp", "show", "--json"], root).stdout)
    quick = next(r for c in rows for e in c.get("experiments") or [] for r in e["revs"] if r.get("name") == "quick")
    metrics = quick["data"]["metrics"]["metrics/benchmark.json"]["data"]["benchmark"]
    assert set(metrics) == {"chat_arithmetic", "chat_capitals"} and "base" in metrics["chat_capitals"]

    set_param(root, "benchmark.gate", {"chat_capitals": {"max_drop": None, "min_score": 1.01}})
    failed = sh(["dvc", "repro", "benchmark"], root, check=False)
    assert failed.returncode != 0
    line = next(x for x in failed.stderr.splitlines() if x.startswith("benchmark: failed: the benchmark gate failed ("))
    assert "chat_capitals: fine-tuned " in line and "below benchmark.gate.chat_capitals.min_score 1.01" in line
    written = json.loads((root / "metrics" / "benchmark.json").read_text())["benchmark"]["chat_capitals"]
    assert f"fine-tuned {written['fine_tuned']:.4f} (base {written['base']:.4f})" in line
