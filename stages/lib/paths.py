"""Where the pipeline's artifacts live, relative to the project root (dvc.yaml's outs).

Each is written by one stage and read by later ones; a stage's own metrics and plots files
are named in that stage's module.
"""

import os

BASE_HF = os.path.join("models", "base-hf")  # base_model: the base HF checkpoint
DATA = os.path.join("data", "chat")  # dataset: train.jsonl, eval.jsonl
CONSTRAINTS = os.path.join("data", "constraints")  # constraints: train.jsonl (trained beside DATA's), heldout.jsonl
LENGTHS = os.path.join("data", "lengths")  # token_lengths: train.npy, eval.npy (tokens per row)
BASE_MAXTEXT = os.path.join("models", "base-maxtext")  # convert_in: MaxText's output directory


def converted_params(checkpoint_dir: str) -> str:
    """Where MaxText's to_maxtext puts the parameters inside its output directory."""
    return os.path.join(checkpoint_dir, "0", "items")


BASE_MAXTEXT_PARAMS = converted_params(BASE_MAXTEXT)  # ... and the parameters in it
SFT_MAXTEXT = os.path.join("models", "sft-maxtext")  # train:
SFT_PARAMS = os.path.join(SFT_MAXTEXT, "params")  # ... the final full parameters (Orbax)
SFT_LORA = os.path.join(SFT_MAXTEXT, "lora")  # ... and, for LoRA runs, the adapter they came from
SFT_HF = os.path.join("models", "sft-hf")  # convert_out: the checked HF export
GGUF = os.path.join("models", "gguf")  # export_gguf: the export as llama.cpp GGUF files, and a Modelfile
PREFERENCE_DATA = os.path.join("data", "preference")  # preference_data: train.jsonl, eval.jsonl (train_dpo's texts)
SELF_PAIRS = os.path.join("data", "self-pairs")  # self_pairs: the SFT model's own answers as pairs (train, eval)
PREFERENCE_MAXTEXT = os.path.join("models", "preference-maxtext")  # preference: the preference-tuned model
PREFERENCE_PARAMS = os.path.join(PREFERENCE_MAXTEXT, "params")  # ... its parameters (Orbax), when it is on
PREFERENCE_SETTINGS = "preference.json"  # ... and, beside them, how it was tuned (algorithm, beta, lengths)
# What the preference stages leave when preference tuning is off: a note, the same bytes every
# time, so that turning it off again finds everything after it in DVC's run-cache.
OFF_NOTE = "README.md"


def tuned_params() -> str:
    """The parameters the pipeline exports and evaluates as its result: the preference-tuned
    model where the preference stage made one, else the SFT model."""
    return PREFERENCE_PARAMS if os.path.isdir(PREFERENCE_PARAMS) else SFT_PARAMS
