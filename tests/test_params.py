"""params.yaml's schema (stages/lib/params.py), in-process: every recipe validates, every
kind of mistake gets its one line, and the published JSON Schema is the schema."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from stages.lib import params as schema
from stages.shared.errors import UserError
from testkit.workspace import DELETE, set_key
from tools.recipe import params_text, recipes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny() -> dict:
    return yaml.safe_load(params_text("tiny"))


def error(p: dict, where: str = "params.yaml") -> str:
    with pytest.raises(UserError) as e:
        schema.validate(p, where)
    return str(e.value)


def changed(p: dict, dotted: str, value) -> dict:
    p = copy.deepcopy(p)
    set_key(p, dotted, value)
    return p


CASES = [
    ("train.setps", 5, "params.yaml: train.setps: unknown key (did you mean train.steps?)"),
    ("train.steps", "ten", "params.yaml: train.steps: expected an integer >= 1, got 'ten'"),
    ("train.steps", True, "params.yaml: train.steps: expected an integer >= 1, got True"),  # YAML's bool is no number
    ("train.steps", 2.5, "params.yaml: train.steps: expected an integer >= 1, got 2.5"),
    ("train.learning_rate", 0, "params.yaml: train.learning_rate: expected a number > 0 and < 1, got 0"),
    ("train.learning_rate", float("nan"), "params.yaml: train.learning_rate: expected a number > 0 and < 1, got nan"),
    ("train.learning_rate", "1e-3", "params.yaml: train.learning_rate: expected a number > 0 and < 1, got '1e-3'"),
    ("train.packing", "true", "params.yaml: train.packing: expected true or false, got 'true'"),
    (
        "model.maxtext_name",
        "llama3-8b",
        "params.yaml: model.maxtext_name: expected one of gemma3-4b, gemma3-12b, gemma3-27b, "
        "llama3.1-8b, llama3.1-70b, llama3.1-405b, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-32b, "
        "got 'llama3-8b' (did you mean llama3.1-8b?)",
    ),
    (
        "dataset.format",
        "share_gpt",
        "params.yaml: dataset.format: expected one of messages, sharegpt, prompt_completion, "
        "got 'share_gpt' (did you mean sharegpt?)",
    ),
    ("train.seed", DELETE, "params.yaml: train.seed: missing (expected an integer >= 0)"),
    ("runtime", DELETE, "params.yaml: runtime: missing (expected a section)"),
    ("train.lora", 5, "params.yaml: train.lora: expected a mapping of keys, got 5"),
    (
        "benchmark.prompts",
        ["ok", "  "],
        "params.yaml: benchmark.prompts: expected a non-empty list of prompts: strings, or conversations "
        "ending in the user's turn, got ['ok', '  ']",
    ),
    (
        "benchmark.prompts",
        [],
        "params.yaml: benchmark.prompts: expected a non-empty list of prompts: strings, or conversations "
        "ending in the user's turn, got []",
    ),
    (
        "benchmark.prompts",
        [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]],
        "params.yaml: benchmark.prompts[0]: the last message must be the user's (the model answers it)",
    ),
    (
        "evaluate",  # a params.yaml from before the greedy answers moved
        {"prompts": ["ok"], "max_new_tokens": 8},
        "params.yaml: evaluate: unknown key (its prompts and max_new_tokens are benchmark.prompts and "
        "benchmark.max_new_tokens: the benchmark stage answers them on the models it loads)",
    ),
    ("base_model.revision", "main", "params.yaml: base_model.revision: expected a 40-character commit hash"),
    (
        "base_model.repo_id",
        "no-owner",
        "params.yaml: base_model.repo_id: expected a Hugging Face repo id like owner/name or null",
    ),
    (
        "dataset.local_dir",
        "/abs/path",
        "params.yaml: dataset.local_dir: expected a directory relative to the project root",
    ),
    ("runtime.data_workers", 2, "params.yaml: runtime.data_workers: expected 0 or 1, got 2"),
    (
        "runtime.data_workers",
        "08",
        "params.yaml: runtime.data_workers: expected 0 or 1, got '08'",
    ),  # found by tests/test_fuzz.py
    (
        "train.warmup_steps_fraction",
        1.0,
        "params.yaml: train.warmup_steps_fraction: expected a number >= 0 and < 1, got 1.0",
    ),
    ("hardware.tpu_env", {"TPU_NAME": "x"}, "params.yaml: hardware.tpu_env: must be null when hardware.kind is cpu"),
    (
        "hardware.tpu_env",
        {"TPU_NAME": 1},
        "params.yaml: hardware.tpu_env: expected a mapping of TPU_* variables to strings or null, got {'TPU_NAME': 1}",
    ),
    ("dataset.eval_split", "validation", "params.yaml: dataset.local_dir: assets/tiny-chat/validation.jsonl not found"),
    (
        "dataset.format",
        "alpaca",
        "params.yaml: dataset.format: expected one of messages, sharegpt, prompt_completion, got 'alpaca'",
    ),
    (
        "dataset.format",
        "prompt_completion",
        "params.yaml: dataset.column: must be null for dataset.format prompt_completion",
    ),
    ("dataset.column", None, "params.yaml: dataset.column: must be set for dataset.format messages"),
]


@pytest.mark.parametrize("dotted,value,message", CASES, ids=[f"{c[0]}={c[1]!r}"[:40] for c in CASES])
def test_each_mistake_is_one_line_naming_the_key(tiny, monkeypatch, dotted, value, message):
    monkeypatch.chdir(ROOT)  # the tiny recipe names its data relative to the project root
    said = error(changed(tiny, dotted, value))
    assert said.startswith(message), said
    assert "\n" not in said


def test_source_specific_keys_are_required_by_their_source(tiny, monkeypatch):
    monkeypatch.chdir(ROOT)
    hub = changed(changed(tiny, "base_model.source", "hub"), "base_model.repo_id", "google/gemma-3-4b-it")
    assert error(hub) == "params.yaml: base_model.revision: must be set when base_model.source is hub"
    tpu = changed(tiny, "hardware.kind", "v6e-8")
    assert error(tpu).startswith("params.yaml: hardware.tpu_env.TPU_ACCELERATOR_TYPE: missing")


def test_a_benchmark_subset_of_one_item_is_refused(tiny, monkeypatch):
    """One item per task leaves lm-eval no standard error, which the gate's allowance needs."""
    monkeypatch.chdir(ROOT)
    p = copy.deepcopy(tiny)
    p["benchmark"]["tasks"][0]["max_items"] = 1
    assert error(p).startswith("params.yaml: benchmark.tasks[0].max_items: expected an integer >= 2 or null, got 1")


def test_not_a_mapping_at_the_top(monkeypatch):
    for value in ([1, 2], None, "text", 3):
        assert error(value, "x.yaml") == f"x.yaml: top level: expected a mapping of keys, got {value!r}"


def test_a_file_that_is_not_yaml_or_not_text(tmp_path):
    (tmp_path / "p.yaml").write_text("train: [steps: 1\n")
    with pytest.raises(UserError, match=r"p.yaml: not valid YAML at line 2"):
        schema.load(str(tmp_path / "p.yaml"))
    (tmp_path / "p.yaml").write_bytes(b"train:\n  steps: \xff\xfe\n")
    with pytest.raises(UserError, match=r"p.yaml: not UTF-8 text"):
        schema.load(str(tmp_path / "p.yaml"))
    with pytest.raises(UserError, match=r"nope.yaml: not found"):
        schema.load(str(tmp_path / "nope.yaml"))


def test_every_recipe_validates(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes name their data relative to the project root
    assert set(recipes()) >= {"tiny", "gemma3-4b-v6e-8"}
    for name in recipes():
        (tmp_path / f"{name}.yaml").write_text(params_text(name))
        schema.load(str(tmp_path / f"{name}.yaml"))


def test_every_recipe_key_is_in_the_schema_and_back(tiny):
    def keys(node, prefix=""):
        out = []
        for k, v in node.items():
            out.append(prefix + k)
            if isinstance(v, dict) and prefix + k != "hardware.tpu_env":
                out += keys(v, f"{prefix}{k}.")
        return out

    # An optional section the recipe leaves null (dataset.package) has no keys of its own there.
    nulls = [
        k
        for k in keys(tiny)
        if k in schema.leaf_paths()
        and schema._section(schema._field_at(tuple(k.split("."))).annotation)
        and _get(tiny, k) is None
    ]
    expected = [p for p in schema.leaf_paths() if not any(p.startswith(f"{n}.") for n in nulls)]
    assert sorted(keys(tiny)) == sorted(expected)


def _get(params: dict, dotted: str):
    for key in dotted.split("."):
        params = params[key]
    return params


def test_the_published_json_schema_is_the_schema():
    committed = json.loads((ROOT / "params.schema.json").read_text())
    assert committed == schema.json_schema(), "params.schema.json is stale: run python -m tools.schema"
    editor = json.loads((ROOT / ".vscode" / "settings.json").read_text())["yaml.schemas"]
    assert editor == {"./params.schema.json": ["params.yaml"]}


def test_the_json_schema_accepts_the_recipes_and_refuses_what_pydantic_refuses(tiny):
    """An editor checks with the JSON Schema, not with pydantic: the two must agree."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema.json_schema())
    assert list(validator.iter_errors(tiny)) == []
    for dotted, value, message in CASES:
        if ": must be " in message or "message must be" in message or dotted == "dataset.eval_split":
            continue  # rules across keys or files: pydantic's side only
        if isinstance(value, float) and value != value:
            continue  # NaN is not JSON
        assert list(validator.iter_errors(changed(tiny, dotted, value))), f"the JSON Schema accepts {dotted}={value!r}"


def test_loaded_params_note_the_keys_a_stage_reads(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(schema, "keys_read", set())
    p = schema.load("recipes/gemma3-4b-v6e-8.yaml")
    _ = p["train"]["lora"]["rank"], p["runtime"].get("keep_scratch"), p["hardware"]
    assert schema.keys_read == {"train", "train.lora", "train.lora.rank", "runtime", "runtime.keep_scratch", "hardware"}


def test_a_conversation_prompts_reads_are_noted_under_its_list(monkeypatch):
    """Sections inside a list inside a list (a conversation among benchmark.prompts) are noted
    under the list's name: they were noted as bare `role` and `content`, keys of no stage."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(schema, "keys_read", set())
    p = schema.validate(yaml.safe_load(params_text("small-chat"))).locate()
    conversation = next(prompt for prompt in p.benchmark.prompts if isinstance(prompt, list))
    _ = [(m.role, m["content"]) for m in conversation], p.benchmark.gate["gsm8k"].max_drop
    assert schema.keys_read == {
        "benchmark",
        "benchmark.prompts",
        "benchmark.prompts.role",
        "benchmark.prompts.content",
        "benchmark.gate",
        "benchmark.gate.gsm8k.max_drop",
    }


def test_tpu_env_passes_further_tpu_variables_through_and_refuses_others(monkeypatch):
    monkeypatch.chdir(ROOT)
    tpu = yaml.safe_load(params_text("gemma3-4b-v6e-8"))
    extra = changed(tpu, "hardware.tpu_env.TPU_PREMAPPED_BUFFER_SIZE", "4294967296")
    loaded = schema.validate(extra, "params.yaml")
    assert loaded["hardware"]["tpu_env"]["TPU_PREMAPPED_BUFFER_SIZE"] == "4294967296"
    said = error(changed(tpu, "hardware.tpu_env.LIBTPU_INIT_ARGS", "--xla_x"))
    assert said.startswith("params.yaml: hardware.tpu_env.LIBTPU_INIT_ARGS: not a TPU_* variable"), said
    assert error(changed(tpu, "hardware.tpu_env.TPU_NAME", DELETE)).startswith(
        "params.yaml: hardware.tpu_env.TPU_NAME: missing"
    )


def test_a_float_as_dvc_writes_it_is_a_number(tmp_path):
    """`dvc exp run -S preference.learning_rate=2.0e-6` writes `2e-06` (YAML 1.2's float; a
    string to PyYAML's YAML 1.1): read as the number it is."""
    import yaml

    from stages.lib.params import load
    from tools.recipe import params_text

    params = yaml.safe_load(params_text("tiny"))
    path = tmp_path / "params.yaml"
    text = yaml.safe_dump(params, sort_keys=False).replace("learning_rate: 0.001", "learning_rate: 2e-06", 1)
    path.write_text(text)
    assert "learning_rate: 2e-06" in text
    assert load(str(path))["train"]["learning_rate"] == 2e-06
