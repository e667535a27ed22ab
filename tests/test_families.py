"""Model families (stages/shared/families/): flags and checks on the real checkpoints' configs,
the traps read in MaxText's conversion code, the tiny models; and (slow) each family's tiny
recipe through the whole pipeline.

    python -m pytest tests/test_families.py -m "not slow"
"""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from stages.shared import families
from stages.shared.checkpoint import CheckpointError
from stages.shared.families import gemma3, llama3, qwen3
from tools.recipe import params_text

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]


def base_with(tmp_path: Path, config_file: str, changes: dict | None = None) -> str:
    config = json.loads((DATA / config_file).read_text())
    config.update(changes or {})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def maxtext_model_config(name: str) -> dict:
    from stages.shared.tiny import maxtext_asset

    return yaml.safe_load(Path(maxtext_asset("configs", "models", f"{name}.yml")).read_text())


@pytest.mark.parametrize(
    "config_file, name", [("Llama-3.1-8B-Instruct.config.json", "llama3.1-8b"), ("Qwen3-8B.config.json", "qwen3-8b")]
)
def test_flags_for_the_real_checkpoint_reproduce_maxtexts_own_model_config(tmp_path, config_file, name):
    """For the recipes' real config.json, every architecture key MaxText's own model file
    sets comes out the same from the checkpoint (the flags then describe that model)."""
    args = dict(a.split("=", 1) for a in families.maxtext_model_args(base_with(tmp_path, config_file), name))
    own = maxtext_model_config(name)
    compared = [k for k in args if k in own]
    assert {
        "base_emb_dim",
        "base_mlp_dim",
        "base_num_decoder_layers",
        "base_num_query_heads",
        "head_dim",
        "vocab_size",
        "rope_max_timescale",
        "normalization_layer_epsilon",
        "logits_via_embedding",
    } <= set(compared)
    for key in compared:
        ours = yaml.safe_load(args[key])
        assert (float(ours) if isinstance(ours, str) else ours) == own[key], key  # YAML 1.1 reads 1e-05 as text


def test_llama_3_1_rope_scaling_is_maxtexts_and_3_2s_is_refused(tmp_path):
    args = families.maxtext_model_args(base_with(tmp_path, "Llama-3.1-8B-Instruct.config.json"), "llama3.1-8b")
    assert "rope_use_scale=true" in args
    with pytest.raises(CheckpointError) as e:  # Llama 3.2 1B: factor 32, which MaxText hard-codes as 8
        families.maxtext_model_args(base_with(tmp_path, "Llama-3.2-1B-Instruct.config.json"), "llama3.1-8b")
    assert (
        "\n" not in str(e.value) and "'factor': 32.0" in str(e.value) and "not convertible by MaxText" in str(e.value)
    )
    no_scaling = families.maxtext_model_args(
        base_with(tmp_path, "Llama-3.1-8B-Instruct.config.json", {"rope_scaling": None}), "llama3.1-8b"
    )
    assert "rope_use_scale=false" in no_scaling  # Llama 3.0: plain RoPE


@pytest.mark.parametrize(
    "config_file, name, changes, named",
    [
        ("Llama-3.1-8B-Instruct.config.json", "llama3.1-8b", {"attention_bias": True}, "attention_bias=True"),
        ("Llama-3.1-8B-Instruct.config.json", "llama3.1-8b", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        (
            "Llama-3.1-8B-Instruct.config.json",
            "llama3.1-8b",
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            "rope_scaling type 'dynamic'",
        ),
        ("Qwen3-8B.config.json", "qwen3-8b", {"use_sliding_window": True}, "use_sliding_window=True"),
        (
            "Qwen3-8B.config.json",
            "qwen3-8b",
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
            "'yarn'",
        ),
        (
            "Qwen3-8B.config.json",
            "qwen3-8b",
            {"model_type": "qwen2"},
            "model_type='qwen2' (a Qwen 3 checkpoint has 'qwen3')",
        ),
        ("Qwen3-8B.config.json", "gemma3-4b", {}, "not convertible by MaxText as gemma3-4b: model_type='qwen3'"),
        ("Llama-3.1-8B-Instruct.config.json", "qwen3-8b", {}, "model_type='llama' (a Qwen 3 checkpoint has 'qwen3')"),
    ],
)
def test_what_maxtext_cannot_represent_is_refused_in_one_line(tmp_path, config_file, name, changes, named):
    with pytest.raises(CheckpointError) as e:
        families.maxtext_model_args(base_with(tmp_path, config_file, changes), name)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_tied_embeddings_come_from_the_checkpoint_whatever_the_name(tmp_path):
    """Qwen3 0.6B-4B tie the output layer to the embedding, 8B does not: MaxText's model
    files fix it per name, the flags take it from the checkpoint."""
    tied = families.maxtext_model_args(
        base_with(tmp_path, "Qwen3-8B.config.json", {"tie_word_embeddings": True}), "qwen3-8b"
    )
    assert "logits_via_embedding=true" in tied and "use_qk_norm" not in " ".join(
        tied
    )  # qk-norm: from qwen3's model file
    assert maxtext_model_config("qwen3-8b")["use_qk_norm"] is True


def test_every_accepted_name_is_in_maxtexts_converter_tables_and_configs():
    from maxtext.checkpoint_conversion.utils import hf_model_configs, param_mapping

    from stages.shared.tiny import maxtext_asset

    for name in families.maxtext_names():
        assert name in hf_model_configs.HF_MODEL_CONFIGS and name in param_mapping.PARAM_MAPPING, name
        assert Path(maxtext_asset("configs", "models", f"{name}.yml")).exists(), name
        assert families.of(name).MAXTEXT_NAMES.count(name) == 1
    with pytest.raises(CheckpointError, match="llama3-8b"):
        families.of("llama3-8b")


def test_llama_export_rounding_is_what_maxtexts_query_hooks_and_the_export_do():
    """The export check's reference for a Llama query kernel: MaxText's own hooks (scale by
    sqrt(head_dim), RoPE permutation) to HF, rounded to bf16 as stages/in_maxtext/assemble_export.py does,
    and MaxText's hooks back. Equal, to float32's last bit, to export_rounding."""
    import ml_dtypes
    from maxtext.checkpoint_conversion.utils import param_mapping

    config = {"num_hidden_layers": 1, "head_dim": 32}
    to_hf = param_mapping.LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN(config, None, scan_layers=False, saving_to_hf=True)
    to_mt = param_mapping.LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN(config, None, scan_layers=False, saving_to_hf=False)
    key = "params-decoder-layers_0-self_attention-query-kernel"
    mt_shape, hf_shape = (128, 4, 32), (128, 128)
    value = np.random.default_rng(0).normal(0, 0.05, mt_shape).astype(np.float32)
    x = value
    for hook in to_hf[key]:
        x = np.asarray(hook(x, hf_shape))
    x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    for hook in to_mt[key]:
        x = np.asarray(hook(x, mt_shape))

    class HF:
        head_dim = 32

    ours = llama3.export_rounding(("decoder", "layers_0", "self_attention", "query", "kernel"), value, "bfloat16", HF)
    np.testing.assert_allclose(ours, x, rtol=2e-7, atol=0)
    assert not np.array_equal(ours, families.rounded(value, "bfloat16"))  # the scaling matters
    plain = llama3.export_rounding(("decoder", "layers_0", "self_attention", "key", "kernel"), value, "bfloat16", HF)
    assert np.array_equal(plain, families.rounded(value, "bfloat16"))


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory) -> dict:
    out = {}
    for family in (llama3, qwen3):
        path = tmp_path_factory.mktemp(family.__name__.rsplit(".", 1)[-1])
        family.build_tiny(str(path), seed=0)
        out[family] = path
    return out


def test_tiny_models_are_convertible_causal_lms_of_their_family(tiny_checkpoints):
    for family, path in tiny_checkpoints.items():
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"][0].endswith("ForCausalLM")
        name = family.MAXTEXT_NAMES[0]
        assert families.check_convertible(str(path), name) == "transformers"
        assert families.of(name) is family
        names = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
        assert ("lm_head.weight" in names) == (not config["tie_word_embeddings"])
        assert any(".q_norm." in n for n in names) == (family is qwen3)  # Qwen 3's qk-norm


def test_tiny_llama_has_llama_3s_real_vocabulary_and_one_bos(tiny_checkpoints):
    """Its tokens are tiktoken's on MaxText's Llama 3 file; like the Hub's tokenizer.json it
    puts <|begin_of_text|> first, except as MaxText loads it (no BOS: the template writes it)."""
    import transformers
    from maxtext.input_pipeline.tokenizer import TikTokenTokenizer

    from stages.in_maxtext.count_tokens import load_tokenizer
    from stages.shared.tiny import maxtext_asset

    path = tiny_checkpoints[llama3]
    reference = TikTokenTokenizer(maxtext_asset("assets", "tokenizers", "tokenizer_llama3.tiktoken"), False, False)
    hub_like, as_maxtext = transformers.AutoTokenizer.from_pretrained(path), load_tokenizer(str(path))
    for text in ["What is the capital of Peru?", "17 plus 25 is 42.", "naïve café, 東京", "  spaces\n\nand lines"]:
        assert as_maxtext(text)["input_ids"] == reference.encode(text)
        assert hub_like(text)["input_ids"] == [128000, *reference.encode(text)]
    rendered = as_maxtext.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_tiny_qwen_has_qwen_3s_own_tokenizer_files_and_its_padded_vocabulary(tiny_checkpoints):
    """As Qwen's real checkpoints: more embedding rows (151,936) than tokens (151,669), and
    the flags give MaxText the checkpoint's row count, so its hook pads or cuts nothing."""
    import transformers

    from stages.shared.tiny import maxtext_asset

    path = tiny_checkpoints[qwen3]
    source = Path(maxtext_asset("assets", "tokenizers", "qwen3-tokenizer"))
    for f in source.iterdir():
        assert (path / f.name).read_bytes() == f.read_bytes()
    tokens = len(transformers.AutoTokenizer.from_pretrained(path))
    rows = json.loads((path / "config.json").read_text())["vocab_size"]
    assert tokens == 151669 < rows == 151936
    assert f"vocab_size={rows}" in families.maxtext_model_args(str(path), "qwen3-0.6b")


def test_each_familys_template_takes_what_the_row_checks_let_through(tiny_checkpoints, tiny_base):
    """A leading system turn, then alternating turns: the served rendering (and MaxText's own
    round splitting) works for every family, the system text kept (Gemma folds it into the
    first user turn) and never trained on."""
    from stages.in_maxtext.count_tokens import load_tokenizer, per_round_counts
    from stages.lib import chat
    from stages.shared import rendering

    row = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Bonjour."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "De rien."},
    ]
    assert chat.problem({"messages": row}) is None
    for path in [tiny_base, *tiny_checkpoints.values()]:
        tokenizer = load_tokenizer(str(path))
        assert "Answer in French." in tokenizer.apply_chat_template(row, tokenize=False)
        trained = "".join(text for text, learned in rendering.render(tokenizer, row).pieces() if learned)
        assert "French" not in trained and "Bonjour." in trained
        assert per_round_counts(tokenizer, row)[0] > len(rendering.render(tokenizer, row).ids) > 10


def test_the_family_recipes_are_their_families():
    """Each family's recipes name its models; the committed ones pin a 40-digit revision."""
    expected = {
        "tiny-llama3": llama3,
        "tiny-qwen3": qwen3,
        "llama3.1-8b-v6e-8": llama3,
        "qwen3-8b-v6e-8": qwen3,
        "tiny": gemma3,
        "small": gemma3,
        "gemma3-4b-v6e-8": gemma3,
    }
    for recipe, family in expected.items():
        p = yaml.safe_load(params_text(recipe))
        assert families.of(p["model"]["maxtext_name"]) is family, recipe
        if p["base_model"]["source"] == "hub":
            assert len(p["base_model"]["revision"]) == 40
    for path in (REPO / "stages").rglob("*.py"):  # nothing outside the families names one
        if "families" not in path.parts:
            text = path.read_text()
            assert not any(f"families import {m}" in text or f"families.{m}" in text for m in families.MODULES), path


# Every family's tiny recipe but Gemma 3's (tiny.yaml: the rest of the suite runs it): those
# that change the model (tiny-dpo keeps tiny's and adds preference tuning: tests/test_preference.py).
FAMILY_RECIPES = sorted(
    p.stem for p in (REPO / "recipes").glob("tiny-*.yaml") if "model" in yaml.safe_load(p.read_text())
)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", FAMILY_RECIPES)
def test_tiny_family_runs_the_whole_pipeline(workspace, recipe):
    """convert in, train, convert out with the export gate, evaluate: a held-out loss that
    drops, an export transformers loads, the same files and tensor names as the base."""
    from testkit.workspace import commit, set_param, sh

    root = workspace(recipe, recipe=recipe)
    # (The suite's time: the benchmark stage on 2 items a task and one prompt. It still runs
    # whole, in each family's template; its scores are not what this tests.)
    set_param(root, "benchmark.limit", 2)
    set_param(root, "benchmark.prompts", ["What is 17 plus 25?"])
    # (And one GGUF type a family, each check reading the 150k-262k-token vocabulary ~10 s:
    # tiny_run checks both of the recipe's on Gemma 3.)
    set_param(root, "gguf.types", ["f16"] if recipe == "tiny-qwen3" else ["q8_0"])
    # (And the held-out losses from training's own evaluations at its first and last step, as the
    # TPU recipes do: evaluate then starts no MaxText process. tiny_run has evaluate compute them.)
    # (And half the recipe's 40 steps, at checkpoint 20: enough for the held-out drop asserted below.)
    steps = 20
    set_param(root, "train.steps", steps)
    set_param(root, "train.eval_interval", steps)
    set_param(root, "runtime.data_workers", 1)  # (in-training evaluations need grain's worker)
    bf16 = recipe == "tiny-qwen3"  # one family's run publishes its final parameters in bf16 (train.save_dtype)
    if bf16:
        set_param(root, "train.save_dtype", "bfloat16")
    commit(root, "a short benchmark, one GGUF type")
    proc = sh(["dvc", "repro"], root, timeout=1500)
    if bf16:  # cast by our module in MaxText's process; convert_out, its check and evaluate read them back
        assert "train.cast: stages.in_maxtext.cast_params done" in proc.stdout, proc.stdout[-3000:]
    check = json.loads((root / "metrics" / "export_check.json").read_text())["export"]
    assert check["passed"] and check["top1_agreement"] >= 0.99, check
    heldout = json.loads((root / "metrics" / "eval.json").read_text())["eval"]
    assert heldout["fine_tuned_loss"] < heldout["base_loss"] - 0.5, heldout
    assert heldout["loss_from"] == "training", heldout
    base, export = root / "models" / "base-hf", root / "models" / "sft-hf"
    base_names = json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(json.loads((export / "model.safetensors.index.json").read_text())["weight_map"]) == set(base_names)
    for f in base.iterdir():
        if not f.name.endswith(".safetensors") and f.name not in ("config.json", "model.safetensors.index.json"):
            assert (export / f.name).read_bytes() == f.read_bytes(), f.name  # tokenizer, template, generation config
    generations = (root / "eval" / "generations.md").read_text()
    assert generations.count("What is 17 plus 25?") >= 1
    assert "done in" in proc.stdout
    assert_gguf_round_trip(root)


def assert_gguf_round_trip(root) -> None:
    """export_gguf's files, each read back by transformers within its type's limits (the
    stage checked them; here the figures it recorded are held to the recipe's limits), the
    Modelfile naming the first."""
    limits = yaml.safe_load((root / "params.yaml").read_text())["gguf"]
    checked = json.loads((root / "metrics" / "gguf_check.json").read_text())["gguf"]
    assert list(checked) == limits["types"] and limits["types"], checked
    for kind, figures in checked.items():
        assert figures["passed"] and figures["kl_max"] <= limits["check"][kind]["max_kl"], (kind, figures)
        assert (root / "models" / "gguf" / figures["file"]).stat().st_size == figures["bytes"]
    assert (
        (root / "models" / "gguf" / "Modelfile")
        .read_text()
        .startswith(f"FROM ./{checked[limits['types'][0]]['file']}\n")
    )


# The config transformers builds from the small recipe's GGUF (google/gemma-3-270m, Q4_K_M),
# as the base_model stage writes it: text-only Gemma 3 (`Gemma3ForCausalLM`), 1 KV head,
# per-layer-type rope_parameters as transformers 5 writes them, tied embeddings.
GEMMA3_270M = "gemma-3-270m.gguf-config.json"


def test_a_text_only_gemma_3_gets_its_own_dimensions_and_rope(tmp_path):
    args = families.maxtext_model_args(base_with(tmp_path, GEMMA3_270M), "gemma3-4b")
    for flag in (
        "base_emb_dim=640",
        "base_num_decoder_layers=18",
        "base_num_kv_heads=1",
        "head_dim=256",
        "vocab_size=262144",
        "sliding_window_size=512",
        "rope_max_timescale=1000000",
        "local_rope_max_timescale=10000",
        "rope_linear_scaling_factor=1.0",
    ):
        assert flag in args, flag


def test_a_text_only_gemma_3_with_untied_embeddings_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="tie_word_embeddings=False"):
        families.maxtext_model_args(base_with(tmp_path, GEMMA3_270M, {"tie_word_embeddings": False}), "gemma3-4b")


def test_a_text_only_gemma_3_reads_maxtexts_tables_in_its_own_tensor_names(tmp_path):
    """MaxText's Gemma 3 tables, given the text-only config as the family hands it to them
    (stages/in_maxtext/main.py), map every scanned layer, and renamed to the text layout
    they name the file's tensors; no vision tensor is asked for."""
    from maxtext.checkpoint_conversion.utils import hf_shape, param_mapping

    from stages.shared.checkpoint import detect_layout, rename

    config = gemma3.converter_config(json.loads((DATA / GEMMA3_270M).read_text()))
    mapping = param_mapping.GEMMA3_MAXTEXT_TO_HF_PARAM_MAPPING(config, None, scan_layers=True)
    text = {k: v for k, v in mapping.items() if "vision" not in k}
    assert text["params-decoder-layers-layers_0-mlp-wi_0-kernel"] == [
        f"model.language_model.layers.{i}.mlp.gate_proj.weight" for i in (0, 6, 12)
    ]
    names = {
        rename(n, gemma3.LAYOUTS["transformers"], gemma3.LAYOUTS["text"])
        for v in text.values()
        for n in (v if isinstance(v, list) else [v])
    }
    assert "model.layers.17.self_attn.k_norm.weight" in names and "model.embed_tokens.weight" in names
    assert len(names) == 2 + 18 * 13
    shapes = hf_shape.GEMMA3_HF_WEIGHTS_TO_SHAPE(config)
    assert shapes["model.language_model.embed_tokens.weight"] == [262144, 640]
    hooks = param_mapping.GEMMA3_MAXTEXT_TO_HF_PARAM_HOOK_FN(config, None, scan_layers=True, saving_to_hf=False)
    embedding = hooks["params-token_embedder-embedding"](np.ones((4, 640), np.float32), (4, 640))
    assert embedding[0, 0] == np.float32(25.25)  # bf16(sqrt(640)): MaxText's normaliser (the export check's too)
    (tmp_path / "config.json").write_text((DATA / GEMMA3_270M).read_text())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, "x")}))
    assert detect_layout(str(tmp_path), gemma3.LAYOUTS, "Gemma 3") == "text"


def test_gemma_3s_maxtext_arithmetic_is_maxtexts_own():
    """families.gemma3.like_maxtext gives transformers MaxText's embedding arithmetic, read in
    MaxText 0.2.5's code: the converter folds bf16(sqrt(hidden)) into the embedding, and the
    tied output head casts that table to bf16 whatever the dtype flags say, then divides by
    the exact sqrt(hidden). If an upgrade changes either, the gates' like-with-like
    comparison is stale: this fails first, by name."""
    import inspect

    import ml_dtypes
    import torch
    import transformers
    from maxtext.checkpoint_conversion.utils import param_mapping
    from maxtext.layers import embeddings

    assert "jnp.asarray(embedding_table, jnp.bfloat16)" in inspect.getsource(embeddings.attend_on_embedding)
    assert 'np.dtype("bfloat16").type(config["text_config"]["hidden_size"] ** 0.5)' in inspect.getsource(
        param_mapping.GEMMA3_MAXTEXT_TO_HF_PARAM_HOOK_FN
    )
    config = transformers.Gemma3TextConfig(
        vocab_size=64,
        hidden_size=640,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
    )
    model = transformers.Gemma3ForCausalLM(config).eval()
    head = gemma3.like_maxtext(model)
    assert float(model.get_input_embeddings().embed_scale) == float(ml_dtypes.bfloat16(640**0.5)) == 25.25
    h = torch.randn(3, 640)
    table = model.get_input_embeddings().weight.detach() * 25.25
    expected = h @ table.to(torch.bfloat16).float().T / 640**0.5
    assert torch.equal(head(h), expected)
    assert not torch.allclose(head(h), model.get_output_embeddings()(h), rtol=1e-5)  # transformers' own head differs


@pytest.mark.parametrize("layout", ["hub", "transformers"])
def test_an_image_text_gemma_3_loads_as_its_language_model_alone(tmp_path, layout):
    """families.language_model, which the gates and the benchmark's generations use: Gemma 3 4B's
    files hold a vision tower that text never runs; loaded without it, in either tensor
    layout, the model gives the whole model's logits exactly, and the tower's tensors are
    not in memory."""
    import safetensors.torch
    import torch
    import transformers

    gemma3.build_tiny(str(tmp_path), seed=0)
    if layout == "transformers":  # rename the files' tensors as transformers >= 4.52 names them
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        renamed = {}
        for shard in set(index["weight_map"].values()):
            tensors = safetensors.torch.load_file(tmp_path / shard)
            tensors = {
                next(
                    (
                        gemma3.LAYOUTS["transformers"][t] + n[len(p) :]
                        for t, p in gemma3.HUB_PREFIX.items()
                        if n.startswith(p)
                    ),
                    n,
                ): v
                for n, v in tensors.items()
            }
            safetensors.torch.save_file(tensors, tmp_path / shard, metadata={"format": "pt"})
            renamed.update(dict.fromkeys(tensors, shard))
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": renamed}))
    assert families.detect_layout(str(tmp_path), "gemma3-4b") == layout
    whole = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path, dtype=torch.float32).eval()
    text = families.language_model(str(tmp_path), "gemma3-4b", torch.float32)
    assert not any("vision" in n for n, _ in text.named_parameters())
    ids = torch.tensor([[2, 105, 2364, 107, 9259, 106]])
    with torch.no_grad():
        assert torch.equal(text(input_ids=ids).logits, whole(input_ids=ids).logits)
