"""params.yaml: loading and validation against the schema below.

Every stage validates the whole file before doing anything, so a typo anywhere fails in the
first second with one line, e.g.

    params.yaml: train.setps: unknown key (did you mean train.steps?)
    params.yaml: train.steps: expected an integer >= 1, got -5

`python -m stages.validate` runs the same check by hand.
"""

import difflib
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from stages.lib import hardware
from stages.lib.cli import UserError

PARAMS_FILE = "params.yaml"


@dataclass(frozen=True)
class Field:
    """One leaf of the schema: what it must be, said the way the error message says it."""

    expect: str
    ok: Callable[[Any], bool]
    nullable: bool = False

    def check(self, value) -> bool:
        return (value is None and self.nullable) or (value is not None and self.ok(value))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def Int(min: int = 0, nullable: bool = False) -> Field:
    return Field(f"an integer >= {min}" + (" or null" if nullable else ""), lambda v: _is_int(v) and v >= min, nullable)


def Num(gt: float | None = None, ge: float | None = None, le: float | None = None, lt: float | None = None) -> Field:
    bounds = [f"> {gt}" if gt is not None else "", f">= {ge}" if ge is not None else "",
              f"<= {le}" if le is not None else "", f"< {lt}" if lt is not None else ""]
    return Field(
        "a number " + " and ".join(b for b in bounds if b),
        lambda v: _is_num(v)
        and (gt is None or v > gt) and (ge is None or v >= ge) and (le is None or v <= le) and (lt is None or v < lt),
    )


def Bool() -> Field:
    return Field("true or false", lambda v: isinstance(v, bool))


def Choice(*options: str) -> Field:
    return Field("one of " + ", ".join(options), lambda v: v in options)


def Str(pattern: str = r".+", expect: str = "a non-empty string", nullable: bool = False) -> Field:
    return Field(expect, lambda v: isinstance(v, str) and re.fullmatch(pattern, v, re.S) is not None, nullable)


def StrList() -> Field:
    return Field("a non-empty list of non-empty strings",
                 lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) and x.strip() for x in v))


# Source-specific keys are null when the other source is chosen; _check_consistency says which.
HF_REPO = Str(r"[\w.-]+/[\w.-]+", "a Hugging Face repo id like owner/name", nullable=True)
# A tag or branch can move under you; a commit hash cannot. Hub sources must name one.
REVISION = Str(r"[0-9a-f]{40}", "a 40-character commit hash (a branch or tag can change under you)", nullable=True)
DTYPE = Choice("bfloat16", "float32")

SCHEMA: dict = {
    "base_model": {
        "source": Choice("tiny", "hub"),
        "repo_id": HF_REPO,
        "revision": REVISION,
        "tiny_seed": Int(0, nullable=True),
    },
    "dataset": {
        "source": Choice("local", "hub"),
        "local_dir": Str(r"[^/].*", "a directory relative to the project root", nullable=True),
        "repo_id": HF_REPO,
        "revision": REVISION,
        "train_split": Str(),
        "eval_split": Str(),
        "column": Str(),
        "max_train_rows": Int(1, nullable=True),
        "max_eval_rows": Int(1, nullable=True),
    },
    "model": {
        "maxtext_name": Choice("gemma3-4b", "gemma3-12b", "gemma3-27b"),
        "scan_layers": Bool(),
        "checkpoint_ocdbt": Bool(),
        "checkpoint_zarr3": Bool(),
    },
    "convert_in": {
        "save_dtype": DTYPE,
    },
    "train": {
        "steps": Int(1),
        "per_device_batch_size": Int(1),
        "gradient_accumulation_steps": Int(1),
        "max_target_length": Int(16),
        "learning_rate": Num(gt=0, lt=1),
        "warmup_steps_fraction": Num(ge=0, lt=1),
        "packing": Bool(),
        "completion_only_loss": Bool(),
        "num_epochs": Int(1),
        "checkpoint_period": Int(1),
        "eval_interval": Int(0),
        "seed": Int(0),
        "lora": {
            "enabled": Bool(),
            "rank": Int(1),
            "alpha": Num(gt=0),
            "module_path": Str(r".*", "a regex of MaxText module paths, or \"\" for MaxText's default for the model"),
        },
    },
    "convert_out": {
        "dtype": DTYPE,
        "shard_size_mb": Int(1),
        "check": {
            "max_kl": Num(gt=0),
            "max_mean_kl": Num(gt=0),
            "min_top1_agreement": Num(ge=0, le=1),
            "tie_margin": Num(ge=0),
        },
    },
    "evaluate": {
        "prompts": StrList(),
        "max_new_tokens": Int(1),
    },
    "hardware": {
        "kind": Choice(*hardware.KINDS),
        # The TPU runtime environment MaxText gets (null for cpu); see _check_consistency.
        "tpu_env": Field("a mapping of TPU_* variables to strings, or null", lambda v: isinstance(v, dict), nullable=True),
    },
    # How to run, not what to compute: no stage declares these, so changing them never
    # re-runs anything.
    "runtime": {
        "scratch_dir": Str(expect="a directory for MaxText's working files (local path, /dev/shm/..., or gs://...)"),
        "keep_scratch": Bool(),
        "keep_checkpoints": Int(1),
        "check_hardware": Bool(),
    },
}


def _leaf_paths(schema: dict, prefix: str = "") -> list[str]:
    out = []
    for key, sub in schema.items():
        out += _leaf_paths(sub, f"{prefix}{key}.") if isinstance(sub, dict) else [prefix + key]
    return out


def _check(node, schema: dict, prefix: str, where: str) -> None:
    if not isinstance(node, dict):
        raise UserError(f"{where}: {prefix.rstrip('.') or 'top level'}: expected a mapping of keys, got {node!r}")
    for key in node:
        if key not in schema:
            name = prefix + str(key)
            close = difflib.get_close_matches(name, _leaf_paths(SCHEMA) + list(SCHEMA), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"{where}: {name}: unknown key{hint}")
    for key, sub in schema.items():
        name = prefix + key
        if key not in node:
            expect = "a section" if isinstance(sub, dict) else sub.expect
            raise UserError(f"{where}: {name}: missing (expected {expect})")
        if isinstance(sub, dict):
            _check(node[key], sub, name + ".", where)
        elif not sub.check(node[key]):
            raise UserError(f"{where}: {name}: expected {sub.expect}, got {node[key]!r}")


def _check_consistency(p: dict, where: str) -> None:
    """Rules that span keys."""
    t = p["train"]
    if t["warmup_steps_fraction"] * t["steps"] >= t["steps"]:
        raise UserError(f"{where}: train.warmup_steps_fraction: leaves no step after warm-up")
    needs = {
        ("base_model", "hub"): ("repo_id", "revision"),
        ("base_model", "tiny"): ("tiny_seed",),
        ("dataset", "hub"): ("repo_id", "revision"),
        ("dataset", "local"): ("local_dir",),
    }
    for (section, source), keys in needs.items():
        if p[section]["source"] == source:
            for key in keys:
                if p[section][key] is None:
                    raise UserError(f"{where}: {section}.{key}: must be set when {section}.source is {source}")
    h = p["hardware"]
    if h["kind"] == "cpu" and h["tpu_env"] is not None:
        raise UserError(f"{where}: hardware.tpu_env: must be null when hardware.kind is cpu")
    if h["kind"] != "cpu":
        env = h["tpu_env"] or {}
        for key in hardware.TPU_ENV_KEYS:
            if not isinstance(env.get(key), str) or not env[key]:
                raise UserError(f"{where}: hardware.tpu_env.{key}: missing (a string; see recipes/gemma3-4b-v6e-8.yaml)")
        unknown = sorted(set(env) - set(hardware.TPU_ENV_KEYS))
        if unknown:
            raise UserError(f"{where}: hardware.tpu_env.{unknown[0]}: unknown variable (known: {', '.join(hardware.TPU_ENV_KEYS)})")
        if env["TPU_ACCELERATOR_TYPE"] != h["kind"]:
            raise UserError(f"{where}: hardware.tpu_env.TPU_ACCELERATOR_TYPE: {env['TPU_ACCELERATOR_TYPE']!r} differs from hardware.kind {h['kind']!r}")
    d = p["dataset"]
    if d["source"] == "local":
        for split in (d["train_split"], d["eval_split"]):
            path = os.path.join(d["local_dir"], f"{split}.jsonl")
            if not os.path.isfile(path):
                raise UserError(f"{where}: dataset.local_dir: {path} not found (one <split>.jsonl per split)")


def load(path: str = PARAMS_FILE) -> dict:
    """The validated params. Raises UserError with one line on anything wrong."""
    try:
        with open(path) as f:
            params = yaml.safe_load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: not found; run from the project root") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    return validate(params, path)


def validate(params, where: str = PARAMS_FILE) -> dict:
    """Checks a params tree against SCHEMA; `where` names its source in the error."""
    _check(params, SCHEMA, "", where)
    _check_consistency(params, where)
    return params
