"""Data from pinned PyPI packages (stages/lib/package_data.py): the chat data, preference pairs
and benchmark data of a package's file, checked before anything is written; ShareGPT's JSON
array, cut off inside its last record, read through the bad-row policy.

The packages here are real distributions on sys.path (a dist-info with its RECORD, as pip
installs one), written by `installed`; the data packages of requirements/data.lock are
read as installed by scripts/setup.sh.
"""

import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from stages.lib import chat, package_data
from stages.shared.errors import UserError
from testkit.workspace import REPO, set_param, sh


def installed(site: Path, name: str, version: str, files: dict[str, bytes]) -> dict:
    """A distribution `name` `version` holding `files` in `site` (a directory on sys.path);
    returns the pin of its first file."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = []
    for path, content in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(content)
        record.append(f"{path},sha256=,{len(content)}")
    (info / "RECORD").write_text("\n".join([*record, f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]) + "\n")
    first, content = next(iter(files.items()))
    return {"name": name, "version": version, "path": first, "sha256": hashlib.sha256(content).hexdigest()}


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    importlib.invalidate_caches()
    return path


def test_a_pinned_file_is_found_and_checked(site):
    pin = installed(site, "some-data", "1.2.0", {"some_data/data/rows.jsonl": b'{"a": 1}\n'})
    assert package_data.locate(pin, "dataset.package") == str(site / "some_data" / "data" / "rows.jsonl")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"name": "not-installed-data"}, "dataset.package.name: the package not-installed-data is not installed; pip"),
        ({"version": "1.3.0"}, "dataset.package.version: some-data 1.2.0 is installed, not the pinned 1.3.0"),
        ({"path": "some_data/rows.jsonl"}, "dataset.package.path: some-data 1.2.0 has no file some_data/rows.jsonl"),
        ({"sha256": "0" * 64}, "dataset.package.sha256: .*rows.jsonl has SHA-256 [0-9a-f]{64}, not the pinned 0000"),
    ],
)
def test_a_bad_pin_is_one_line_naming_its_key(site, change, message):
    pin = installed(site, "some-data", "1.2.0", {"some_data/data/rows.jsonl": b'{"a": 1}\n'})
    with pytest.raises(UserError, match=message) as raised:
        package_data.locate({**pin, **change}, "dataset.package")
    assert "\n" not in str(raised.value)


def sharegpt(records: list, cut: bool = False) -> bytes:
    text = json.dumps(records, indent=1, ensure_ascii=False)
    return (text[: text.rindex("{") + 40] if cut else text).encode()


def record(i: int, turns: list[tuple[str, str]]) -> dict:
    return {"id": f"r{i}", "conversations": [{"from": who, "value": text} for who, text in turns]}


GOOD = [("human", "Bonjour 🙂"), ("gpt", "Salut !"), ("human", "Ça va ?"), ("gpt", "Oui.")]


def test_a_json_array_is_read_record_by_record_and_a_cut_off_last_one_is_a_bad_row(tmp_path):
    records = [record(i, GOOD) for i in range(2500)]  # ~400 KB: read in several chunks
    path = tmp_path / "sharegpt.json"
    path.write_bytes(sharegpt(records, cut=True))
    chat.ARRAY_CHUNK, chunk = 4096, chat.ARRAY_CHUNK  # records straddle many chunk boundaries
    try:
        rows = list(chat.read_json_array(str(path)))
    finally:
        chat.ARRAY_CHUNK = chunk
    assert [value for _, value, _ in rows[:-1]] == records[:-1]
    assert rows[-1] == (2500, None, "cut off: the file ends inside this record")


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"not": "an array"}', "not a JSON array of records"),
        (b'[{"id": 1}, {"id": 2,, "x": 3}, {"id": 4}]', "record 2 is not valid JSON"),
        (b'[{"id": "\xff"}]', "not UTF-8 text"),
    ],
)
def test_a_json_array_that_cannot_be_read_is_one_line(tmp_path, content, message):
    path = tmp_path / "data.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        list(chat.read_json_array(str(path)))


# An IFEval prompt's words pasted into a turn, its case and punctuation changed (prompt 21's end)
PASTED = [("human", "Bonjour"), ("gpt", "Salut ! IS THERE anything else -- I can help with, today?")]
# Its words split over two turns: no run of 8 within one text
SPLIT = [("human", "Is there anything else"), ("gpt", "I can help with? Oui.")]


def test_the_dataset_stage_reads_a_package_file_through_the_bad_row_policy(workspace, tmp_path):
    """A ShareGPT-like package of 30 records: every 5th row held out (the last, cut off, among
    them), a conversation that starts with the assistant (a ShareGPT fragment) and the cut-off
    record skipped, counted and listed; a training conversation that holds 8 words in a row of
    an IFEval prompt left out and listed with the prompt (dataset.decontaminate), one whose
    turns only share them between them kept, and a held-out one kept."""
    turns = {7: GOOD[1:], 12: PASTED, 13: SPLIT, 15: PASTED}
    records = [record(i, turns.get(i, GOOD)) for i in range(1, 31)]
    site = tmp_path / "site"
    pin = installed(site, "chat-data", "0.1.0", {"chat_data/data/sharegpt.json": sharegpt(records, cut=True)})
    root = workspace("package-data")
    for key, value in {
        "source": "package",
        "package": pin,
        "holdout_every": 5,
        "local_dir": None,
        "train_split": None,
        "eval_split": None,
        "format": "sharegpt",
        "column": "conversations",
        "on_bad_row": "skip",
        "max_skipped_fraction": 0.5,
    }.items():
        set_param(root, f"dataset.{key}", value)
    sh([sys.executable, "-m", "stages.dataset"], root, PYTHONPATH=f"{site}:{REPO}")
    counts = json.loads((root / "metrics" / "dataset.json").read_text())
    assert counts == {"train": {"rows": 22, "skipped": 1, "decontaminated": 1}, "eval": {"rows": 5, "skipped": 1}}
    skipped = [json.loads(line) for line in (root / "data" / "chat" / "skipped.jsonl").read_text().splitlines()]
    assert [(s["split"], s["row"]) for s in skipped] == [("train", 7), ("train", 12), ("eval", 30)]
    assert skipped[1]["reason"] == "shares 8 words with ifeval prompt 21: 'is there anything else i can help with'"
    assert skipped[2]["reason"] == "cut off: the file ends inside this record"
    first = json.loads((root / "data" / "chat" / "eval.jsonl").read_text().splitlines()[0])
    assert first["messages"][0] == {"role": "user", "content": "Bonjour 🙂"}


def test_the_dataset_stage_refuses_a_bad_pin_before_writing(workspace, tmp_path):
    site = tmp_path / "site"
    pin = installed(site, "chat-data", "0.1.0", {"chat_data/data/sharegpt.json": sharegpt([record(1, GOOD)])})
    root = workspace("package-data-bad")
    for key, value in {"source": "package", "package": {**pin, "sha256": "1" * 64}, "holdout_every": 5}.items():
        set_param(root, f"dataset.{key}", value)
    proc = sh([sys.executable, "-m", "stages.dataset"], root, check=False, PYTHONPATH=f"{site}:{REPO}")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().startswith("dataset: error: dataset.package.sha256: ") and "\n" not in proc.stderr.strip()
    )
    assert not (root / "data").exists() and not (root / "metrics" / "dataset.json").exists()


def test_the_data_lock_pins_what_the_recipes_read():
    """Every package file a recipe names is installed at its pinned version and bytes (as
    scripts/setup.sh installs requirements/data.lock): the recipes' pins are right."""
    import yaml

    from tools.recipe import params_text

    lock = (REPO / "requirements" / "data.lock").read_text()
    pins = []
    for recipe in sorted(p.stem for p in (REPO / "recipes").glob("*.yaml")):
        params = yaml.safe_load(params_text(recipe))
        pins += [params["dataset"]["package"], params["preference"]["data"]["package"]]
        pins += [t.get("data") for t in params["benchmark"]["tasks"]]
    pins = {json.dumps(p, sort_keys=True): p for p in pins if p}
    assert len(pins) >= 4  # ShareGPT, IFEval, GSM8K, MMLU
    for pin in pins.values():
        assert f"{pin['name']}=={pin['version']} " in lock
        package_data.locate(pin, "recipe")


@pytest.mark.parametrize("bad_rows", [0, 1])
def test_a_split_whose_every_good_row_holds_a_benchmark_prompt_is_refused_by_name(bad_rows):
    """Refused, not written empty, whether or not bad rows were skipped beside them."""
    why = "shares 8 words with ifeval prompt 3"
    selection = chat.Selection("train.jsonl", "messages", "skip", 0.5, exclude=lambda record: why)
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    rows = [(1, good, None), (2, good, None)] + [(3, None, "not JSON")] * bad_rows
    with pytest.raises(UserError, match=r"every good row shares .* \(shares 8 words with ifeval prompt 3\); check"):
        list(selection.rows(rows))
