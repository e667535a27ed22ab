"""The committed recipe (Gemma 3 4B on a TPU v6e-8), proven on CPU: it stops at once on a
machine without the TPU, its MaxText commands carry the tutorial's values and pass MaxText's
own config validation; the ahead-of-time fit check runs for real for a v5e chip (the 4B's
parsing and out-of-memory verdict on recorded compiler output, tests/test_fit_check.py)."""

import json
import socket
import sys

import pytest
import yaml

from testkit.workspace import REPO, dry_run_args, set_param, sh, with_real_4b_config


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
    args = dry_run_args(proc.stdout)
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
def test_fit_check_compiles_a_train_step_for_a_v5e_chip(workspace):
    """The fit check for real, once in the suite: MaxText's ahead-of-time compile with libtpu
    on this CPU, for one v5e chip (small-chat-v5e-1's hardware), of the tiny model's train
    step; its figures read from XLA's memory analysis. (The real recipes' steps: the 270M's
    took 115 s alone, 185 s beside the rest of the suite; the 4B's for a v6e-8 6-7 minutes.
    `python -m stages.fit_check` makes either, and the pipeline runs it before every TPU
    training; the 270M's prediction is held against the chip in docs/benchmarks.md, "On a TPU
    chip"; the 4B's recorded compiler output is parsed in tests/test_fit_check.py.)"""
    from stages.shared.families import gemma3

    root = workspace("fit")
    for key, value in yaml.safe_load((REPO / "recipes" / "small-chat-v5e-1.yaml").read_text())["hardware"].items():
        set_param(root, f"hardware.{key}", value)
    base = root / "models" / "base-hf"
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps(gemma3.hub_config(gemma3.TINY_TEXT, gemma3.TINY_VISION)))
    proc = sh([sys.executable, "-m", "stages.fit_check"], root, timeout=1200)
    report = json.loads((root / "metrics" / "fit_check.json").read_text())["fit"]
    assert report["fits"] and report["hardware"] == "v5litepod-1"
    assert "fits a v5litepod-1" in proc.stdout
    # The arguments are the float32 parameters and Adam's two moments: 12 bytes a parameter.
    t = gemma3.TINY_TEXT
    attention = t["hidden_size"] * t["head_dim"] * (2 * t["num_attention_heads"] + 2 * t["num_key_value_heads"])
    layer = attention + 3 * t["hidden_size"] * t["intermediate_size"]
    parameters = 262144 * t["hidden_size"] + t["num_hidden_layers"] * layer  # (norms: a rounding error)
    gib = report["per_chip_gib"]
    assert gib["arguments"] == pytest.approx(12 * parameters / 2**30, rel=0.1), gib
    assert gib["total"] == pytest.approx(gib["arguments"] + gib["temporaries"] + gib["code"], abs=0.05), gib


def with_config_for(root, maxtext_name: str):
    """models/base-hf for a bigger Gemma 3: the 4B's config with the language model's
    dimensions from MaxText's own config for `maxtext_name` (as far as the flags need it)."""
    from tools.plan import maxtext_model_config

    with_real_4b_config(root)
    path = root / "models" / "base-hf" / "config.json"
    config, m = json.loads(path.read_text()), maxtext_model_config(maxtext_name)
    config["text_config"].update(
        hidden_size=m["base_emb_dim"],
        intermediate_size=m["base_mlp_dim"],
        num_hidden_layers=m["base_num_decoder_layers"],
        num_attention_heads=m["base_num_query_heads"],
        num_key_value_heads=m["base_num_kv_heads"],
        head_dim=m["head_dim"],
        # MaxText's 27B scales queries by (hidden / heads)**-0.5, the 4B and 12B by head_dim's
        query_pre_attn_scalar=m["head_dim"]
        if maxtext_name != "gemma3-27b"
        else m["base_emb_dim"] // m["base_num_query_heads"],
    )
    path.write_text(json.dumps(config))
    return root


EVERY_MAXTEXT_STAGE = ("convert_in", "train", "preference", "convert_out", "evaluate")


@pytest.mark.slow  # MaxText's own validation: a MaxText import per stage
@pytest.mark.parametrize(
    ("recipe", "model", "hosts", "stages"),
    [
        ("gemma3-12b-v6e-16", "gemma3-12b", 4, EVERY_MAXTEXT_STAGE),
        # (The 27B's one-process stages are the 12B's code with other numbers: its jobs only.)
        ("gemma3-27b-v6e-32", "gemma3-27b", 8, ("train", "preference")),
    ],
)
def test_slice_recipes_pass_maxtexts_validation_with_one_process_conversions(workspace, recipe, model, hosts, stages):
    """On a slice, training is one job over every host; the conversions and evaluate run as one
    process on worker 0 (hardware=cpu skip_jax_distributed_system=true, as the tutorial's
    to_maxtext). Every stage that starts MaxText, validated by MaxText (fit_check compiles:
    run for real above)."""
    root = with_config_for(workspace(f"dry-run-{model}", recipe=recipe), model)
    set_param(root, "preference.enabled", True)  # preference tuning's job too (its data: the Hub's, not read here)
    printed = {}
    for stage in stages:
        printed[stage] = sh([sys.executable, "-m", f"stages.{stage}", "--dry-run"], root, timeout=300).stdout
        assert f"{stage}: MaxText accepted the configuration for " in printed[stage], (stage, printed[stage])
        assert f"model_name={model}" in printed[stage]
        one_process = "hardware=cpu" in printed[stage] and "skip_jax_distributed_system=true" in printed[stage]
        assert one_process == (stage not in ("train", "preference")), (stage, printed[stage])
    for stage in ("train", "preference"):
        assert printed[stage].count("worker ") >= hosts, printed[stage]
    assert "maxtext:configs/post_train/dpo.yml" in printed["preference"]
