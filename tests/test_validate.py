"""`python -m tools.validate` reads local data as the dataset stage does, in every
`dataset.format`: it accepts valid sets and names the first bad row of a bad one, without
running anything (its row checks are tests/test_chat.py's; here, that it is the stage's
reading, format and all)."""

import json
import sys

import pytest
import yaml

from testkit.workspace import REPO, sh
from tools.recipe import params_text

SHAREGPT = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
PAIR = {"prompt": "What is 2 plus 2?", "completion": "4."}
FORMATS = {
    "sharegpt": ("conversations", SHAREGPT),
    "prompt_completion": (None, PAIR),
    "messages": (
        "messages",
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi."}]},
    ),
}


def validate(root, fmt: str, rows: list, max_eval_rows=None):
    """tools.validate in `root`, on the tiny recipe with its data replaced by `rows` in `fmt`."""
    params = yaml.safe_load(params_text("tiny"))
    column, _ = FORMATS[fmt]
    params["dataset"].update(format=fmt, column=column, local_dir="chat", max_eval_rows=max_eval_rows)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "chat").mkdir(exist_ok=True)
    for split in ("train", "eval"):
        (root / "chat" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return sh([sys.executable, "-m", "tools.validate"], root, check=False, PYTHONPATH=str(REPO))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_validate_accepts_a_valid_local_set_in_each_format(tmp_path, fmt):
    proc = validate(tmp_path, fmt, [FORMATS[fmt][1]] * 3)
    assert proc.returncode == 0, proc.stderr
    assert "chat/train.jsonl: 3 conversations ok" in proc.stdout
    assert "chat/eval.jsonl: 3 conversations ok" in proc.stdout


def test_validate_names_the_bad_row_of_a_bad_set(tmp_path):
    bad = {"conversations": [{"from": "gpt", "value": "I speak first."}]}
    proc = validate(tmp_path, "sharegpt", [SHAREGPT, bad, SHAREGPT])
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("validate: error: chat/train.jsonl") and "row 2" in line, line


def test_validate_reads_as_many_rows_as_the_stage(tmp_path):
    """Rows past dataset.max_eval_rows never reach training, so they are not held against it."""
    bad = {"prompt": "no completion"}
    proc = validate(tmp_path, "prompt_completion", [PAIR, PAIR, bad], max_eval_rows=2)
    assert proc.returncode == 2 and "chat/train.jsonl" in proc.stderr  # the train split reads every row
    (tmp_path / "chat" / "train.jsonl").write_text(json.dumps(PAIR) + "\n")
    proc = sh([sys.executable, "-m", "tools.validate"], tmp_path, check=False, PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert "chat/eval.jsonl: 2 conversations ok" in proc.stdout
