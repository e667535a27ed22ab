"""The committed recipe (Gemma 3 4B on a TPU v6e-8), proven on CPU: it stops at once on a
machine without the TPU, its MaxText commands carry the tutorial's values and pass MaxText's
own config validation, and the ahead-of-time fit check runs for a v6e-8."""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from conftest import sh

REAL_CONFIG = Path(__file__).parent / "data" / "gemma-3-4b-it.config.json"


def with_real_4b_config(root: Path) -> Path:
    """models/base-hf as far as the checks need it: google/gemma-3-4b-it's config.json and
    an index naming its tensors in the Hub's layout (no weights: nothing here loads them)."""
    base = root / "models" / "base-hf"
    base.mkdir(parents=True)
    (base / "config.json").write_text(REAL_CONFIG.read_text())
    (base / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"language_model.model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    return root


def test_dvc_repro_on_a_cpu_machine_stops_at_once(workspace):
    root = workspace("tpu-on-cpu", recipe="gemma3-4b-v6e-8")
    # A Hub that cannot be reached: any download attempt would hang or fail differently.
    proc = sh(["dvc", "repro"], root, check=False, timeout=60, HF_ENDPOINT="http://127.0.0.1:9", HF_TOKEN=None)
    assert proc.returncode != 0
    assert proc.elapsed < 5, proc.elapsed
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith(("base_model: error:", "dataset: error:"))]
    assert len(ours) == 1, proc.stderr
    assert "hardware.kind is v6e-8 but this machine has no TPU" in ours[0]
    assert "python -m stages.recipe tiny && dvc repro" in ours[0]
    assert not (root / "models").exists() and not (root / "dvc.lock").exists()


@pytest.mark.parametrize("stage,expected", [
    ("convert_in", ["model_name=gemma3-4b", "scan_layers=true", "checkpoint_storage_use_ocdbt=true",
                    "checkpoint_storage_use_zarr3=true", "base_emb_dim=2560", "base_num_decoder_layers=34",
                    "--save_dtype=bfloat16"]),
    ("train", ["model_name=gemma3-4b", "scan_layers=true", "steps=1000", "per_device_batch_size=1",
               "max_target_length=2048", "learning_rate=2e-05", "packing=true", "sft_train_on_completion_only=true",
               "train_data_columns=['messages']", "checkpoint_storage_use_ocdbt=true", "checkpoint_storage_use_zarr3=true"]),
    ("convert_out", ["model_name=gemma3-4b", "scan_layers=true", "weight_dtype=float32", "use_multimodal=false"]),
])
def test_committed_recipe_commands_pass_maxtexts_validation(workspace, stage, expected):
    root = with_real_4b_config(workspace("dry-run", recipe="gemma3-4b-v6e-8"))
    proc = sh([sys.executable, "-m", f"stages.{stage}", "--dry-run"], root, timeout=300)
    command = proc.stdout.split("would run:", 1)[1]
    args = [a.strip(" \\") for a in command.split() if a.strip(" \\")]
    for value in expected:
        assert value in args, f"{value} not in {stage}'s MaxText command"
    assert "hardware=cpu" not in args  # a TPU recipe runs MaxText on the TPU
    assert "MaxText accepted the configuration" in proc.stdout
    assert not any(a.startswith("hf_access_token") for a in args)


def test_committed_recipe_is_the_tutorials_workload():
    p = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())
    assert (p["base_model"]["repo_id"], p["dataset"]["repo_id"]) == ("google/gemma-3-4b-it", "HuggingFaceH4/ultrachat_200k")
    assert (p["dataset"]["train_split"], p["dataset"]["column"]) == ("train_sft", "messages")
    assert (p["train"]["steps"], p["train"]["per_device_batch_size"]) == (1000, 1)
    assert p["model"]["scan_layers"] and p["model"]["checkpoint_ocdbt"] and p["model"]["checkpoint_zarr3"]
    assert p["convert_out"]["dtype"] == "bfloat16" and p["hardware"]["kind"] == "v6e-8"


@pytest.mark.slow
def test_fit_check_fits_the_committed_recipe_on_a_v6e_8(workspace):
    root = with_real_4b_config(workspace("fit", recipe="gemma3-4b-v6e-8"))
    proc = sh([sys.executable, "-m", "stages.fit_check"], root, timeout=1200)
    report = json.loads((root / "metrics" / "fit_check.json").read_text())
    assert report["fits"] and report["hardware"] == "v6e-8"
    assert 8 < report["per_chip_gib"]["total"] < 24  # ~13 GB measured by hand before this existed
    assert report["per_chip_gib"]["arguments"] > 3  # f32 params + Adam state, sharded over 8 chips
    assert "fits a v6e-8" in proc.stdout


@pytest.mark.slow
def test_fit_check_rejects_an_absurd_batch_saying_by_how_much(workspace):
    root = with_real_4b_config(workspace("no-fit", recipe="gemma3-4b-v6e-8"))
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["per_device_batch_size"] = 64
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = sh([sys.executable, "-m", "stages.fit_check"], root, check=False, timeout=1200)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "per_device_batch_size=64" in line and "does not fit a v6e-8" in line, line
    assert re.search(r"over the chip's HBM \([\d.]+ GiB\) by [\d.]+ GiB", line), line
    assert "python -m stages.fit_check --search per_device_batch_size" in line
    assert not (root / "metrics" / "fit_check.json").exists()
