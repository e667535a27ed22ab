"""Where the pipeline's artifacts live, relative to the project root (dvc.yaml's outs).

Each is written by one stage and read by later ones; a stage's own metrics and plots files
are named in that stage's module.
"""

import os

BASE_HF = os.path.join("models", "base-hf")  # base_model: the base HF checkpoint
DATA = os.path.join("data", "chat")  # dataset: train.jsonl, eval.jsonl
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
