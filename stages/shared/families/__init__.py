"""Model families: all that differs between Gemma 3, Llama 3 and Qwen 3, one module each.

Nothing outside this package names a family. A family module defines:

  NAME          how messages name it ("Gemma 3")
  MAXTEXT_NAMES the `model.maxtext_name` values it accepts: names MaxText's converters have
                in their tables (HF_MODEL_CONFIGS, PARAM_MAPPING), with a config in
                maxtext/configs/models/
  LAYOUTS       {layout: {tower: tensor-name prefix}}, "transformers" first: the names
                MaxText's parameter mapping uses; others are how the Hub's files name them
  model_args(config, model_name) -> the MaxText flags that make `model_name` equal the
                checkpoint's config (a SimpleNamespace of CONFIG_FIELDS, from
                checkpoint.text_config); raises CheckpointError, naming the field, for one
                MaxText's decoder cannot represent exactly
  CONFIG_FIELDS the text-config fields model_args reads
  MODEL_TYPE    the (text) config's model_type: anything else is refused before model_args
  export_rounding(path, value, dtype, hf_config) -> what a MaxText parameter (at `path` in
                the model's state) is once exported to `dtype` and read back (the export
                check's reference)
  like_maxtext(hf_model) (optional) -> gives a transformers model MaxText's own arithmetic
                where the two differ by design; returns MaxText's output head (the gates)
  build_tiny(out_dir, seed) -> writes a tiny checkpoint of the family, offline
  TINY          one line: what the tiny model is and where its tokenizer comes from
  PIPELINE_TAG  the Hub's task for a model card (tools/publish.py)
  END_OF_TURN   the chat template's end-of-turn marker: where an answer ends (the benchmark's
                stop string; training finds it in the template itself, stages/shared/rendering.py)

Adding a family is one module here plus its tiny recipe (docs/families.md, "Adding a model family").
"""

import importlib
import pkgutil

from stages.shared import checkpoint
from stages.shared.checkpoint import CheckpointError

MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)))  # every module here is a family


def _load(name: str):
    return importlib.import_module(f"stages.shared.families.{name}")


def all_families() -> list:
    return [_load(m) for m in MODULES]


def maxtext_names() -> tuple[str, ...]:
    """Every `model.maxtext_name` the pipeline accepts."""
    return tuple(n for f in all_families() for n in f.MAXTEXT_NAMES)


def of(model_name: str):
    """The family module of a MaxText model name."""
    for family in all_families():
        if model_name in family.MAXTEXT_NAMES:
            return family
    raise CheckpointError(f"model.maxtext_name: {model_name!r} is not one of {', '.join(maxtext_names())}")


def detect_layout(model_dir: str, model_name: str) -> str:
    family = of(model_name)
    return checkpoint.detect_layout(model_dir, family.LAYOUTS, family.NAME)


def maxtext_model_args(model_dir: str, model_name: str) -> list[str]:
    """MaxText flags that make its `model_name` architecture equal the checkpoint's config.

    Raises CheckpointError for a config MaxText cannot represent, rather than converting it
    into a different model."""
    family = of(model_name)
    config = checkpoint.text_config(model_dir, ("model_type", *family.CONFIG_FIELDS))
    try:
        if config.model_type != family.MODEL_TYPE:
            raise CheckpointError(
                f"model_type={config.model_type!r} (a {family.NAME} checkpoint has {family.MODEL_TYPE!r})"
            )
        return family.model_args(config, model_name)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}/config.json: not convertible by MaxText as {model_name}: {e}") from None


def check_convertible(model_dir: str, model_name: str) -> str:
    """Fails with one line unless model_dir is a checkpoint of `model_name`'s family that
    MaxText represents exactly; returns its tensor layout."""
    layout = detect_layout(model_dir, model_name)
    maxtext_model_args(model_dir, model_name)
    return layout


def export_rounding(model_name: str, path: tuple[str, ...], value, dtype: str, hf_config):
    return of(model_name).export_rounding(path, value, dtype, hf_config)


def like_maxtext(model_name: str, hf_model):
    """MaxText's output head for a transformers model of the family (the family's
    `like_maxtext`, which also sets the model's input arithmetic to MaxText's), or None where
    the family computes as transformers does."""
    adapt = getattr(of(model_name), "like_maxtext", None)
    return adapt(hf_model) if adapt else None


def language_model(model_dir: str, model_name: str, dtype=None):
    """The checkpoint's language model alone, in transformers, for text in and logits out.

    A text-only checkpoint loads as it is (AutoModelForCausalLM). An image-text one (Gemma 3
    4B and up) loads as its text model class on its `text_config`, its language-model tensors
    renamed from whichever of the family's LAYOUTS the files use: the vision tower's tensors
    are never read into memory (at 4B, ~0.4 B parameters that text SFT never touched, and
    that no text prompt would run). Same logits as the whole model on text (tested:
    tests/test_families.py)."""
    import re

    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    if not hasattr(config, "vision_config"):
        return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    text_class = transformers.AutoModelForCausalLM._model_mapping[type(config.text_config)]
    renames = {
        "^" + re.escape(towers["language_model"]): "model."
        for towers in of(model_name).LAYOUTS.values()
        if towers.get("language_model", "model.") != "model."
    }
    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its load report lists every vision tensor left unread
    try:
        model = text_class.from_pretrained(model_dir, config=config.text_config, dtype=dtype, key_mapping=renames)
    finally:
        transformers.logging.set_verbosity(previous)
    return model.eval()


def rounded(x, dtype: str):
    """x (float32) rounded to the export dtype and read back as float32."""
    import ml_dtypes
    import numpy as np

    if dtype == "float32":
        return x
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def dimension_args(config, model_name: str) -> list[str]:
    """The flags every family takes from its checkpoint: MaxText's `model_name`, its
    dimensions overridden with the checkpoint's (every family's CONFIG_FIELDS has these)."""
    return [
        f"model_name={model_name}",
        "override_model_config=true",
        f"base_emb_dim={config.hidden_size}",
        f"base_mlp_dim={config.intermediate_size}",
        f"base_num_decoder_layers={config.num_hidden_layers}",
        f"base_num_query_heads={config.num_attention_heads}",
        f"base_num_kv_heads={config.num_key_value_heads}",
        f"head_dim={config.head_dim}",
        f"vocab_size={config.vocab_size}",
        f"normalization_layer_epsilon={config.rms_norm_eps}",
    ]


def problems_in(config, expected: dict) -> list[str]:
    """`field=value (why)` for each field of `config` that differs from `expected`
    ({field: (value, why)})."""
    return [f"{k}={getattr(config, k)!r} ({why})" for k, (v, why) in expected.items() if getattr(config, k) != v]


def refuse(problems: list[str]) -> None:
    if problems:
        raise CheckpointError("; ".join(problems))
