"""The fine-tuned export: loads with transformers, is the base's architecture, holds the
trained weights, and the export check rejects broken exports."""

import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import yaml

from stages.in_maxtext import assemble_export
from stages.shared.families import gemma3

pytestmark = pytest.mark.slow


def tensors(model_dir) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(safetensors.numpy.load_file(f))
    return out


def test_export_passed_the_check(tiny_run):
    found = json.loads((tiny_run.path / "metrics" / "export_check.json").read_text())
    report = found["export"]
    limits = yaml.safe_load((tiny_run.path / "params.yaml").read_text())["convert_out"]["check"]
    assert report["passed"] is True
    assert report["top1_agreement"] >= limits["min_top1_agreement"]
    assert report["kl_max"] <= limits["max_kl"] and report["kl_mean"] <= limits["max_mean_kl"]
    assert any(p["tokens"] > 64 for p in found["prompts"])  # longer than the tiny sliding window


def test_export_loads_with_transformers_and_generates(tiny_run):
    import torch
    import transformers

    export_dir = tiny_run.path / "models" / "sft-hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    model, info = transformers.AutoModelForImageTextToText.from_pretrained(export_dir, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 plus 4?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    answer = out[0, prompt["input_ids"].shape[1] :].tolist()
    assert 0 < len(answer) <= 8
    if len(answer) < 8:  # stopped early: only on the chat template's end of turn, as trained
        eos = model.generation_config.eos_token_id
        assert answer[-1] in (eos if isinstance(eos, list) else [eos]), tokenizer.decode(answer)


def test_export_config_is_the_base_config(tiny_run):
    base, sft = tiny_run.path / "models" / "base-hf", tiny_run.path / "models" / "sft-hf"
    assert assemble_export.config_differences(str(sft), str(base)) == []
    text = json.loads((sft / "config.json").read_text())["text_config"]
    assert text["hidden_activation"] == "gelu_pytorch_tanh"  # not the table's exact-erf "gelu"
    assert text["rope_theta"] == 1_000_000.0  # not the table's 10000
    assert text["num_hidden_layers"] == 8 and text["hidden_size"] == 128


def test_export_has_every_base_tensor_and_the_trained_weights(tiny_run):
    import orbax.checkpoint as ocp

    base = tensors(tiny_run.path / "models" / "base-hf")
    sft = tensors(tiny_run.path / "models" / "sft-hf")
    assert {k: v.shape for k, v in sft.items()} == {k: v.shape for k, v in base.items()}
    lm = gemma3.HUB_PREFIX["language_model"]
    for name in base:  # the vision tower is not trained: carried over bit for bit
        if not name.startswith(lm):
            assert np.array_equal(base[name].view(np.uint16), sft[name].view(np.uint16)), name

    mt = ocp.PyTreeCheckpointer().restore(os.path.abspath(tiny_run.path / "models" / "sft-maxtext" / "params"))
    d = mt["decoder"]
    hidden = 128

    def close(exported, expected):
        expected = np.asarray(expected, np.float32)
        np.testing.assert_allclose(
            exported.astype(np.float32), expected, rtol=2**-7, atol=2**-7 * np.abs(expected).max() * 1e-2
        )

    # Tensor by tensor, MaxText layout -> HF layout, written out independently of MaxText's mapping:
    # MaxText stores the embedding scaled by sqrt(hidden) and RMSNorm scales as 1 + w.
    close(
        sft[f"{lm}embed_tokens.weight"],
        np.asarray(mt["token_embedder"]["embedding"]["value"]) / np.float32(ml_dtypes.bfloat16(hidden**0.5)),
    )
    close(sft[f"{lm}norm.weight"], np.asarray(d["decoder_norm"]["scale"]["value"]) - 1)
    rem = d["layers_remainder"]["layers_0"]  # HF layer 6 (layers 0-5 are scanned)
    close(
        sft[f"{lm}layers.6.self_attn.q_proj.weight"],
        np.asarray(rem["self_attention"]["query"]["kernel"]["value"]).reshape(hidden, -1).T,
    )
    close(sft[f"{lm}layers.6.mlp.gate_proj.weight"], np.asarray(rem["mlp"]["wi_0"]["kernel"]["value"]).T)
    close(sft[f"{lm}layers.6.pre_feedforward_layernorm.weight"], np.asarray(rem["pre_ffw_norm"]["scale"]["value"]) - 1)
    scanned = d["layers"]["layers_0"]  # HF layer 0; axis 1 is the scan axis
    close(
        sft[f"{lm}layers.0.self_attn.k_proj.weight"],
        np.asarray(scanned["self_attention"]["key"]["kernel"]["value"])[:, 0].reshape(hidden, -1).T,
    )
    close(
        sft[f"{lm}layers.0.self_attn.k_norm.weight"],
        np.asarray(scanned["self_attention"]["key_norm"]["scale"]["value"])[:, 0] - 1,
    )
    # ...and training really changed them.
    assert not np.array_equal(base[f"{lm}layers.6.mlp.gate_proj.weight"], sft[f"{lm}layers.6.mlp.gate_proj.weight"])


def wrong_rope(d):
    config = json.loads((d / "config.json").read_text())
    config["text_config"]["rope_theta"] = 10000.0  # MaxText's hard-coded table's value
    (d / "config.json").write_text(json.dumps(config))


def scale_embedding(d):
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    name = gemma3.HUB_PREFIX["language_model"] + "embed_tokens.weight"
    path = d / index[name]
    shard = safetensors.numpy.load_file(path)
    shard[name] = (shard[name].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)
    safetensors.numpy.save_file(shard, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def rejected(tiny_run, tmp_path_factory) -> dict:
    """Broken copies of tiny_run's export, checked as convert_out checks an export (one
    process for all of them): {fault: (report, failures)}."""
    from stages import convert_out
    from stages.lib.params import load

    tmp = tmp_path_factory.mktemp("broken-exports")
    exports = {}
    for corrupt in (wrong_rope, scale_embedding):
        copy = tmp / corrupt.__name__
        shutil.copytree(tiny_run.path / "models" / "sft-hf", copy)  # a real copy: the original links into the cache
        corrupt(copy)
        exports[str(copy)] = str(tmp / f"{corrupt.__name__}.json")
    cwd = os.getcwd()
    os.chdir(tiny_run.path)
    try:
        checked = convert_out.check_exports(load(), exports)
    finally:
        os.chdir(cwd)
    return dict(zip(("wrong_rope", "scale_embedding"), checked, strict=True))


def test_check_rejects_the_tables_rope_theta(rejected):
    report, failures = rejected["wrong_rope"]
    assert any("rope_parameters" in f for f in failures), failures  # the config comparison
    assert any("KL" in f for f in failures), failures  # and the logits themselves


def test_check_rejects_a_scaled_tensor(rejected):
    report, failures = rejected["scale_embedding"]
    assert failures and all("config" not in f for f in failures), failures
    assert any(f.startswith("max KL") for f in failures) and any(f.startswith("mean KL") for f in failures)


def test_a_conversion_the_gate_refuses_is_not_published(workspace, tiny_base):
    """convert_in with limits no conversion meets: the stage fails with one line naming the
    limit, models/base-maxtext is not written, and the figures are in its metrics file."""
    import sys

    from testkit.workspace import set_param, sh

    root = workspace("conversion-refused")
    shutil.copytree(tiny_base, root / "models" / "base-hf")  # what base_model writes
    set_param(root, "convert_in.check.max_kl", 1.0e-30)
    proc = sh([sys.executable, "-m", "stages.convert_in"], root, check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("convert_in:")]
    assert len(errors) == 1 and "the conversion check failed (max KL" in errors[0] and "> 1e-30" in errors[0], (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not (root / "models" / "base-maxtext").exists()
    assert not list((root / "models").glob(".base-maxtext*"))  # nor its staging directory or report
    figures = json.loads((root / "metrics" / "convert_check.json").read_text())["conversion"]
    assert figures["passed"] is False and 0 < figures["kl_max"] < 1e-3 and figures["top1_agreement"] == 1.0
