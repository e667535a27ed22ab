"""Hub sources: the pipeline's real download code against a local stand-in for the Hub
(testkit/hub_server.py), pinned revisions, gated models and clear errors."""

import json
import secrets
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from testkit.hub_server import HubServer
from testkit.workspace import sh

MODEL = "google/gemma-3-4b-it"
MODEL_SHA = "093f9f388b31de276ce2de164bdc2081324b9767"
DATASET = "HuggingFaceH4/ultrachat_200k"
DATASET_SHA = "8049631c405ae6576f93f445c6b8166f76f5505a"
# Made up per session, so that no tracked file holds anything shaped like a real token.
GOOD_TOKEN = "hf_" + secrets.token_hex(17)  # its account accepted the license
OTHER_TOKEN = "hf_" + secrets.token_hex(17)  # its account did not


def conversation(i: int) -> list[dict]:
    return [{"content": f"question {i}", "role": "user"}, {"content": f"answer {i}.", "role": "assistant"}]


def parquet_bytes(rows: int, tmp_path, name: str) -> bytes:
    path = tmp_path / name
    table = pa.table(
        {
            "prompt": [f"question {i}" for i in range(rows)],
            "prompt_id": [str(i) for i in range(rows)],
            "messages": [conversation(i) for i in range(rows)],
        }
    )
    pq.write_table(table, path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_base):
    """A stand-in Hub with a gated tiny Gemma 3 (Hub layout) and an UltraChat-shaped dataset."""
    root = tmp_path_factory.mktemp("hub")
    model_dir = tiny_base
    data = tmp_path_factory.mktemp("data")
    server = HubServer(root / "repos")
    server.add_repo("model", MODEL, MODEL_SHA, from_dir=model_dir, gated_tokens={GOOD_TOKEN})
    server.add_repo(
        "dataset",
        DATASET,
        DATASET_SHA,
        files={
            "README.md": b"# UltraChat 200k (test stand-in)\n",
            "data/train_sft-00000-of-00001.parquet": parquet_bytes(30, data, "train.parquet"),
            "data/test_sft-00000-of-00001.parquet": parquet_bytes(8, data, "test.parquet"),
        },
    )
    server.endpoint = server.start()
    server.model_dir = model_dir
    yield server
    server.stop()


def hub_workspace(workspace, **changes):
    root = workspace("hub")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["base_model"].update(source="hub", repo_id=MODEL, revision=MODEL_SHA, tiny_seed=None)
    params["dataset"].update(
        source="hub",
        local_dir=None,
        repo_id=DATASET,
        revision=DATASET_SHA,
        train_split="train_sft",
        eval_split="test_sft",
        max_eval_rows=5,
    )
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        params[section][key] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def run_stage(hub, root, stage, token=None):
    home = root.parent / f"{root.name}-hf-home"
    extra = dict(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(home),
        HF_HUB_CACHE=str(home / "hub"),
        HF_DATASETS_CACHE=str(home / "datasets"),
        HF_HUB_OFFLINE="0",
        HF_DATASETS_OFFLINE="0",
    )
    return sh([sys.executable, "-m", f"stages.{stage}"], root, check=False, timeout=300, HF_TOKEN=token, **extra)


def test_base_model_downloads_the_pinned_revision(hub, workspace):
    root = hub_workspace(workspace)
    proc = run_stage(hub, root, "base_model", token=GOOD_TOKEN)
    assert proc.returncode == 0, proc.stderr
    got = root / "models" / "base-hf"
    served = sorted(p.name for p in hub.model_dir.iterdir())
    assert sorted(p.name for p in got.iterdir()) == served  # no .cache bookkeeping left behind
    for name in served:
        assert (got / name).read_bytes() == (hub.model_dir / name).read_bytes(), name
    assert "%|" in proc.stderr  # download progress bars
    resolved = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert resolved and all(MODEL_SHA in p for p in resolved)  # never "main"


@pytest.mark.parametrize(
    "token,message",
    [
        (None, f"{MODEL} is gated and no Hugging Face token was found: accept its license at"),
        (OTHER_TOKEN, f"{MODEL} is gated and your token has no access to it: accept the license at"),
    ],
    ids=["no-token", "license-not-accepted"],
)
def test_gated_model_fails_at_once_with_one_line(hub, workspace, token, message):
    root = hub_workspace(workspace)
    before = len(hub.requests)
    proc = run_stage(hub, root, "base_model", token=token)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (root / "models").exists()
    # Refused on the metadata probe: no file was downloaded (bench/fail_fast.py times it).
    assert not [r for r in hub.requests[before:] if r.method == "GET" and "/resolve/" in r.path and r.status == 200]
    if token:
        assert token not in proc.stderr + proc.stdout


def test_unknown_revision_is_named(hub, workspace):
    root = hub_workspace(workspace, **{"base_model.revision": "0" * 40})
    proc = run_stage(hub, root, "base_model", token=GOOD_TOKEN)
    assert proc.returncode == 2
    assert f"{MODEL}: revision {'0' * 40} not found" in proc.stderr


def test_dataset_streams_the_pinned_revision(hub, workspace):
    root = hub_workspace(workspace)
    proc = run_stage(hub, root, "dataset")
    assert proc.returncode == 0, proc.stderr
    train = [json.loads(line) for line in (root / "data" / "chat" / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (root / "data" / "chat" / "eval.jsonl").read_text().splitlines()]
    assert train == [{"messages": conversation(i)} for i in range(30)]
    assert len(evals) == 5  # dataset.max_eval_rows
    assert json.loads((root / "metrics" / "dataset.json").read_text()) == {
        "train": {"rows": 30, "skipped": 0, "decontaminated": 0},
        "eval": {"rows": 5, "skipped": 0},
    }


def test_unknown_split_is_named(hub, workspace):
    root = hub_workspace(workspace, **{"dataset.train_split": "train_gen"})
    proc = run_stage(hub, root, "dataset")
    assert proc.returncode == 2
    assert f"{DATASET}: no split 'train_gen'" in proc.stderr.strip().splitlines()[-1]
