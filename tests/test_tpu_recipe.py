"""The committed recipe (Gemma 3 4B on a TPU v6e-8), proven on CPU: it stops at once on a
machine without the TPU, its MaxText commands carry the tutorial's values and pass MaxText's
own config validation, and the ahead-of-time fit check runs for a v6e-8 (once for real; its
parsing and its out-of-memory verdict on recorded compiler output, tests/test_fit_check.py)."""

import json
import socket
import sys

import pytest
import yaml

from testkit.workspace import REPO, sh, with_real_4b_config


def test_dvc_repro_on_a_cpu_machine_stops_before_fetching_anything(workspace):
    root = workspace("tpu-on-cpu", recipe="gemma3-4b-v6e-8")
    # A "Hub" that only counts who calls it: any attempt to fetch would connect here.
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        hub.settimeout(0)
        proc = sh(
            ["dvc", "repro"],
            root,
            check=False,
            timeout=60,
            HF_ENDPOINT=f"http://127.0.0.1:{hub.getsockname()[1]}",
            HF_TOKEN=None,
        )
        with pytest.raises(BlockingIOError):
            hub.accept()  # nobody connected (bench/fail_fast.py times how soon it stops)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith(("base_model: error:", "dataset: error:"))]
    assert len(ours) == 1, proc.stderr
    assert "hardware.kind is v6e-8 but this machine has no TPU" in ours[0]
    assert "python -m tools.recipe tiny && dvc repro" in ours[0]
    assert not (root / "models").exists() and not (root / "dvc.lock").exists()


@pytest.mark.slow  # MaxText's own validation: a MaxText import per stage
@pytest.mark.parametrize(
    "stage,expected",
    [
        (
            "convert_in",
            [
                "model_name=gemma3-4b",
                "scan_layers=true",
                "checkpoint_storage_use_ocdbt=true",
                "checkpoint_storage_use_zarr3=true",
                "base_emb_dim=2560",
                "base_num_decoder_layers=34",
                "--save_dtype=float32",
            ],
        ),
        (
            "train",
            [
                "model_name=gemma3-4b",
                "scan_layers=true",
                "steps=1000",
                "per_device_batch_size=1",
                "max_target_length=2048",
                "learning_rate=2e-05",
                "packing=true",
                "sft_train_on_completion_only=true",
                "train_data_columns=['messages']",
                "checkpoint_storage_use_ocdbt=true",
                "checkpoint_storage_use_zarr3=true",
            ],
        ),
        ("convert_out", ["model_name=gemma3-4b", "scan_layers=true", "weight_dtype=float32", "use_multimodal=false"]),
    ],
)
def test_committed_recipe_commands_pass_maxtexts_validation(workspace, stage, expected):
    root = with_real_4b_config(workspace("dry-run", recipe="gemma3-4b-v6e-8"))
    proc = sh([sys.executable, "-m", f"stages.{stage}", "--dry-run"], root, timeout=300)
    command = proc.stdout.split("would run:", 1)[1]
    args = [a.strip(" \\") for a in command.split() if a.strip(" \\")]
    for value in expected:
        assert value in args, f"{value} not in {stage}'s MaxText command"
    assert "hardware=cpu" not in args  # a TPU recipe runs MaxText on the TPU
    config = "post_train/sft.yml" if stage == "train" else "base.yml"
    assert args[args.index("--") + 1].endswith(config)  # the config file its entry point documents, validated
    assert "MaxText accepted the configuration for maxtext." in proc.stdout and config in proc.stdout
    assert not any(a.startswith("hf_access_token") for a in args)


def test_committed_recipe_is_the_tutorials_workload():
    p = yaml.safe_load((REPO / "recipes" / "gemma3-4b-v6e-8.yaml").read_text())  # = params.yaml (test_environment.py)
    assert (p["base_model"]["repo_id"], p["dataset"]["repo_id"]) == (
        "google/gemma-3-4b-it",
        "HuggingFaceH4/ultrachat_200k",
    )
    assert (p["dataset"]["train_split"], p["dataset"]["column"]) == ("train_sft", "messages")
    assert (p["train"]["steps"], p["train"]["per_device_batch_size"]) == (1000, 1)
    assert p["model"]["scan_layers"] and p["model"]["checkpoint_ocdbt"] and p["model"]["checkpoint_zarr3"]
    assert p["convert_out"]["dtype"] == "bfloat16" and p["hardware"]["kind"] == "v6e-8"


@pytest.mark.slow
def test_fit_check_fits_the_committed_recipe_on_a_v6e_8(workspace):
    root = with_real_4b_config(workspace("fit", recipe="gemma3-4b-v6e-8"))
    proc = sh([sys.executable, "-m", "stages.fit_check"], root, timeout=1200)
    report = json.loads((root / "metrics" / "fit_check.json").read_text())["fit"]
    assert report["fits"] and report["hardware"] == "v6e-8"
    assert 8 < report["per_chip_gib"]["total"] < 24  # ~13 GB measured by hand before this existed
    assert report["per_chip_gib"]["arguments"] > 3  # f32 params + Adam state, sharded over 8 chips
    assert "fits a v6e-8" in proc.stdout
