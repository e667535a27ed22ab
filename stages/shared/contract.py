"""The contract between a stage and the MaxText process it starts: typed, one request per job.

A stage (the parent, stages/lib/flags.py builds its jobs) starts

    python -m stages.in_maxtext.main <module> --setup '<Setup as JSON>' [--request '<request as JSON>'] \
        -- <MaxText's own flags, its config file first>

The wrapper (stages/in_maxtext/main.py) decodes `Setup`, does what it says (MaxText's table
entry from the checkpoint's config, its tensor names, the served chat rendering, inputs copied
from gs://), then runs <module>: one of MaxText's entry points, unmodified, on its own flags;
or one of our child modules (stages/in_maxtext/), which declares the request it takes
(`REQUEST`) and gets it back as the same dataclass, with MaxText's flags beside it. MaxText's
flags stay MaxText's: a list of `key=value` strings it validates itself.

Standard library only: both processes import this in their first milliseconds.
"""

import dataclasses
import json
import typing
from dataclasses import dataclass, field

ENTRY = "stages.in_maxtext.main"  # python -m ENTRY <module> ...
OURS = "stages.in_maxtext."  # a module under it is ours and takes a request

# MaxText's entry points the stages run.
TO_MAXTEXT = "maxtext.checkpoint_conversion.to_maxtext"
TO_HUGGINGFACE = "maxtext.checkpoint_conversion.to_huggingface"
TRAIN_SFT = "maxtext.trainers.post_train.sft.train_sft"
TRAIN_DPO = "maxtext.trainers.post_train.dpo.train_dpo"
TRAIN_COMPILE = "maxtext.trainers.pre_train.train_compile"
SFT_RUN_NAME = "sft"
PREFERENCE_RUN_NAME = "preference"


@dataclass(frozen=True)
class Setup:
    """What the wrapper does before <module> runs."""

    model_name: str  # MaxText's model_name: whose tables (and family) apply
    hf_config: str | None = None  # a checkpoint whose config.json replaces MaxText's table entry for model_name
    hf_layout: str = "transformers"  # the tensor-name layout of the HF checkpoint read
    served_chat: bool = False  # the SFT pipeline renders conversations as served (in_maxtext/served_chat.py)
    fetch: dict[str, str] = field(default_factory=dict)  # {gs:// directory: local copy}, made first on each worker
    events_dir: str | None = None  # training's TensorBoard events here, not on gs:// (in_maxtext/local_events.py)
    lora_compile: bool = False  # train_compile's model gets LoRA's adapters, as SFT's does (in_maxtext/main.py)


@dataclass(frozen=True)
class LogitCheck:
    """logit_check: the conversion check (MaxText on converted parameters against transformers
    on each HF checkpoint of `reports`) or the export check (each export against MaxText on the
    trained parameters rounded as exported); MaxText's flags load the parameters."""

    base: str  # the base HF checkpoint: its config and tokenizer
    reports: dict[str, str]  # {HF checkpoint to compare: its report}
    tie_margin: float
    conversion: bool = False  # the conversion check (else the export check)
    dtype: str | None = None  # export check: what the export's weights were rounded to
    lora_base: str | None = None  # export check of a LoRA run: the base parameters ...
    lora_adapter: str | None = None  # ... and the adapter, applied unmerged by MaxText


@dataclass(frozen=True)
class ExportJob:
    """export_job: to_huggingface (MaxText's flags: the job's own), the export assembled into
    `out`, then `check` on it with its own MaxText flags."""

    out: str
    shard_bytes: int
    report: str
    check: LogitCheck
    check_flags: list[str]


@dataclass(frozen=True)
class HeldOut:
    """heldout: each checkpoint's held-out loss (MaxText's flags: SFT's data pipeline), and,
    with `pairs`, their scores on the held-out preference pairs (with `pairs_flags`, train_dpo's)."""

    report: str
    checkpoints: dict[str, str]  # {name: parameters}, in order
    pairs: dict[str, str] = field(default_factory=dict)  # {name: parameters}, the reference first
    algorithm: str = "dpo"
    beta: float = 0.1  # DPO's beta, or ORPO's lambda
    pairs_flags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DataPosition:
    """data_position: the rows training's input pipeline consumed in its first `steps` steps."""

    steps: int
    report: str
    streams: list[str] = field(default_factory=list)  # each host's stream, replayed in place of hf_train_files


@dataclass(frozen=True)
class Batches:
    """batches: the first `rows` rows MaxText's SFT pipeline makes of its training data."""

    rows: int
    report: str


@dataclass(frozen=True)
class CountTokens:
    """count_tokens: tokens (and trained tokens) per conversation, as training renders them."""

    tokenizer: str
    rendering: str
    splits: dict[str, str]  # {chat JSONL: output prefix}


@dataclass(frozen=True)
class CastParams:
    """cast_params: a parameter checkpoint written again in another dtype."""

    source: str
    out: str
    dtype: str


@dataclass(frozen=True)
class MergeLora:
    """merge_lora: the adapter merged into full parameters."""

    base: str
    adapter: str
    scale: float  # LoRA's alpha / rank
    out: str


@dataclass(frozen=True)
class EngineSize:
    """What MaxText's inference engine is sized for (stages/in_maxtext/engine.py): its KV cache
    holds `slots` sequences of a prompt and an answer."""

    slots: int  # answers decoded at once (and rows per log-likelihood batch)
    max_prompt: int  # a prompt's tokens (a longer one keeps its end)
    max_answer: int  # the longest answer asked for, in tokens


@dataclass(frozen=True)
class EngineBenchmark:
    """engine_benchmark: lm-eval's tasks (the stage's task files) on each model through MaxText's
    inference engine, and each model's greedy answers to `prompts`; one report."""

    models: dict[str, str]  # {name: MaxText parameters}, in order
    tokenizer: str  # the base checkpoint's directory: tokenizer and chat template
    task_dir: str
    tasks: list[dict]  # [{"name": ..., "chat_template": bool, "metric": its score's key}], in order
    limit: int | None
    bootstrap_iters: int
    max_length: int  # tokens of prompt and answer lm-eval may use (its truncation)
    prompts: list  # benchmark.prompts: strings or conversations
    max_new_tokens: int
    end_of_turn: str
    size: EngineSize
    report: str


@dataclass(frozen=True)
class EngineAnswers:
    """engine_answers: answers of each model to the conversations of a JSON Lines file
    (tools/answers.py), greedy or sampled, written as JSON Lines."""

    models: dict[str, str]  # {name: MaxText parameters}, in order
    tokenizer: str
    conversations: str  # checked rows: {"messages": [...]} each
    out: str
    samples: int
    temperature: float
    seed: int
    max_new_tokens: int
    end_of_turn: str
    size: EngineSize


def encode(value) -> str:
    """A Setup or request as one command-line argument. Its mappings keep their order (no
    sort_keys): HeldOut's `pairs` names the reference first."""
    return json.dumps(dataclasses.asdict(value))


def decode(text: str, kind: type):
    """The JSON `encode` wrote, as `kind` again (nested requests too)."""
    return _build(kind, json.loads(text))


def _build(kind: type, data: dict):
    hints = typing.get_type_hints(kind)
    values = {}
    for f in dataclasses.fields(kind):
        if f.name in data:
            value = data[f.name]
            values[f.name] = _build(hints[f.name], value) if dataclasses.is_dataclass(hints[f.name]) else value
    return kind(**values)
