"""Bad input to any stage stops it before MaxText starts, with one line naming the field or
file, in seconds, leaving no output behind: the stages themselves, as DVC runs them. (Each
params mistake's message is checked in-process by tests/test_params.py, each chat row's by
tests/test_chat.py.)"""

import json
import shutil
import sys

import pytest
import yaml

from testkit.workspace import DELETE, set_key, sh

TRAIN = "assets/tiny-chat/train.jsonl"


def edit_params(fn):
    def apply(root):
        path = root / "params.yaml"
        params = yaml.safe_load(path.read_text())
        fn(params)
        path.write_text(yaml.safe_dump(params, sort_keys=False))

    return apply


def write_rows(rows, path=TRAIN):
    def apply(root):
        (root / path).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))

    return apply


GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


def msgs(*pairs):
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


def fake_base(config_changes: dict, weights: bool = True):
    """A models/base-hf holding only a config (and an index), for convert_in's checks."""

    def apply(root):
        from stages.shared.families import gemma3

        base = root / "models" / "base-hf"
        base.mkdir(parents=True)
        config = gemma3.hub_config(gemma3.TINY_TEXT, gemma3.TINY_VISION)
        config["text_config"].update(config_changes)
        (base / "config.json").write_text(json.dumps(config))
        if weights:
            (base / "model.safetensors.index.json").write_text(
                json.dumps(
                    {"weight_map": {"language_model.model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}
                )
            )

    return apply


def params_case(key_path, value):
    def change(p):
        set_key(p, ".".join(key_path), value)

    return edit_params(change)


# (id, stage, break the workspace, the message's telling part)
CASES = [
    (
        "unknown-key",
        "base_model",
        edit_params(lambda p: p["train"].update(setps=5)),
        "train.setps: unknown key (did you mean train.steps?)",
    ),
    (
        "wrong-type",
        "base_model",
        params_case(("train", "steps"), "ten"),
        "train.steps: expected an integer >= 1, got 'ten'",
    ),
    (
        "out-of-range",
        "base_model",
        params_case(("train", "learning_rate"), 0),
        "train.learning_rate: expected a number > 0",
    ),
    (
        "bad-choice",
        "base_model",
        params_case(("model", "maxtext_name"), "llama3-8b"),
        "model.maxtext_name: expected one of gemma3-4b",
    ),
    ("missing-key", "base_model", params_case(("train", "seed"), DELETE), "train.seed: missing"),
    (
        "not-yaml",
        "base_model",
        lambda root: (root / "params.yaml").write_text("train: [steps: 1\n"),
        "params.yaml: not valid YAML",
    ),
    (
        "hub-without-revision",
        "base_model",
        edit_params(lambda p: p["base_model"].update(source="hub", repo_id="google/gemma-3-4b-it", tiny_seed=None)),
        "base_model.revision: must be set when base_model.source is hub",
    ),
    (
        "branch-not-commit",
        "base_model",
        edit_params(lambda p: p["base_model"].update(source="hub", repo_id="google/gemma-3-4b-it", revision="main")),
        "base_model.revision: expected a 40-character commit hash",
    ),
    (
        "split-file-missing",
        "dataset",
        params_case(("dataset", "eval_split"), "validation"),
        "validation.jsonl not found",
    ),
    (
        "not-json",
        "dataset",
        write_rows(
            [GOOD, GOOD, '{"messages": [oops'],
        ),
        "train.jsonl, row 3: not valid JSON",
    ),
    (
        "unknown-role",
        "dataset",
        write_rows([GOOD, msgs(("user", "Hi"), ("bot", "Hello."))]),
        "row 2: messages[1].role: 'bot' is not one of",
    ),
    (
        "not-alternating",
        "dataset",
        write_rows([msgs(("user", "a"), ("user", "b"), ("assistant", "c"))]),
        "row 1: messages[1].role: expected assistant",
    ),
    (
        "empty-content",
        "dataset",
        write_rows([GOOD, msgs(("user", "  "), ("assistant", "c"))]),
        "row 2: messages[0].content: must be a non-empty string",
    ),
    (
        "system-not-first",
        "dataset",
        write_rows([msgs(("user", "a"), ("system", "b"), ("assistant", "c"))]),
        "row 1: messages[1]: a system message is only allowed first",
    ),
    (
        "ends-with-user",
        "dataset",
        write_rows([msgs(("user", "a"), ("assistant", "b"), ("user", "c"))]),
        "row 1: the last message must be from the assistant",
    ),
    ("wrong-column", "dataset", write_rows([{"conversations": GOOD["messages"]}]), "row 1: no 'messages' column"),
    ("empty-split", "dataset", write_rows([]), "no rows; an empty split cannot be trained"),
    (
        "no-base-checkpoint",
        "convert_in",
        lambda root: None,
        "models/base-hf/config.json: not found; run the base_model stage first",
    ),
    (
        "no-base-weights",
        "convert_in",
        fake_base({}, weights=False),
        "no model.safetensors.index.json or model.safetensors",
    ),
    ("unsupported-activation", "convert_in", fake_base({"hidden_activation": "gelu"}), "hidden_activation='gelu'"),
]


def assert_stopped_at_once(proc, root, stage: str, message: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert message in lines[0], lines[0]
    assert lines[0].startswith(f"{stage}: error: ")
    assert not (root / "logs").exists()  # MaxText never started
    assert not (root / "dvc.lock").exists()
    for out in ("data/chat", "models/base-maxtext", "models/sft-maxtext", "metrics/dataset.json", ".scratch"):
        assert not (root / out).exists()
    if stage == "base_model":
        assert not (root / "models").exists()


@pytest.mark.parametrize("stage,breakage,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_fast_with_one_line(workspace, stage, breakage, message):
    root = workspace("bad")
    breakage(root)
    proc = sh([sys.executable, "-m", f"stages.{stage}"], root, check=False)
    assert_stopped_at_once(proc, root, stage, message)


def test_no_disk_for_the_checkpoints_stops_training_before_it_starts(workspace, tiny_base):
    root = workspace("no-disk")
    shutil.copytree(tiny_base, root / "models" / "base-hf")  # what base_model writes
    params_case(("runtime", "keep_checkpoints"), 10**9)(root)
    proc = sh([sys.executable, "-m", "stages.train"], root, check=False)
    assert_stopped_at_once(proc, root, "train", "not enough free disk for MaxText's training checkpoints in")


def test_bad_input_through_dvc_repro(workspace):
    root = workspace("bad-dvc")
    edit_params(lambda p: p["train"].update(setps=5))(root)
    proc = sh(["dvc", "repro"], root, check=False)
    assert proc.returncode != 0
    assert "base_model: error: params.yaml: train.setps: unknown key (did you mean train.steps?)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (root / "dvc.lock").exists()


def test_grid_refuses_a_bad_variant_before_queuing_any(workspace):
    root = workspace("bad-grid")
    proc = sh([sys.executable, "-m", "tools.grid", "train.learning_rate=1e-3,-1", "train.stpes=40"], root, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "grid: error: train.learning_rate=1e-3 train.stpes=40: train.stpes: unknown key (did you mean train.steps?)"
    ]
    proc = sh([sys.executable, "-m", "tools.grid", "train.learning_rate=1e-3,-1"], root, check=False)
    assert "train.learning_rate=-1: train.learning_rate: expected a number > 0" in proc.stderr
    assert "queued" not in proc.stdout
    assert "No experiment tasks" in sh(["dvc", "queue", "status"], root).stdout
