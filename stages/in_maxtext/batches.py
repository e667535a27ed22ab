"""The rows MaxText's SFT input pipeline makes of a data file, exactly as its trainer receives
them: what training sees, and learns from, token by token (python -m tools.batches).

Run through stages.in_maxtext.main, with the flags training uses (stages/lib/flags.py):

    python -m stages.in_maxtext.main stages.in_maxtext.batches --setup '{..., "served_chat": true}' \
        --request '{"rows": 4, "report": "R.json"}' -- <sft.yml and the run's MaxText flags, hf_train_files=<the data>>

Writes {"rows": [{"ids": [...], "trained": [...]}, ...]}: each row's tokens up to its last
non-padding one, and for each token whether it is a target training learns (MaxText shifts
the targets: token i is learned where the target of position i - 1 is kept).
"""

import json
import sys

from stages.in_maxtext.data_position import training_batches
from stages.shared import contract

REQUEST = contract.Batches


def pad_id(config) -> int:
    """The id MaxText pads with (its own choice, from the tokenizer as it loads it)."""
    import transformers
    from maxtext.input_pipeline import hf_data_processing

    tokenizer = transformers.AutoTokenizer.from_pretrained(config.tokenizer_path, legacy=False, extra_special_tokens={})
    return hf_data_processing._get_pad_id(tokenizer)


def rows_of(batch: dict, pad: int) -> list[dict]:
    out = []
    for inputs, kept, segments in zip(
        batch["inputs"], batch["targets_segmentation"], batch["inputs_segmentation"], strict=True
    ):
        # A row ends where its padding starts: segment 0 when packed; unpacked, MaxText pads
        # the ids and their segmentation alike with the pad id (-1 for Llama 3, which has none).
        padding = (segments == 0) | ((inputs == pad) & (segments == pad))
        real = (~padding).nonzero()[0]
        length = int(real.max()) + 1 if len(real) else 0
        trained = [False] + [bool(k > 0) for k in kept[: length - 1]]
        out.append({"ids": [int(t) for t in inputs[:length]], "trained": trained[:length]})
    return out


def run(request: contract.Batches, maxtext_flags: list[str], setup: contract.Setup) -> None:
    from absl import flags

    flags.FLAGS(sys.argv[:1])  # Grain reads absl flags, which MaxText's app.run would parse
    config, batches = training_batches(maxtext_flags)
    pad = pad_id(config)
    rows: list[dict] = []
    for batch in batches:
        rows += rows_of(batch, pad)
        if len(rows) >= request.rows:
            break
    with open(request.report, "w") as f:
        json.dump({"rows": rows[: request.rows]}, f)
    print(f"batches: {min(len(rows), request.rows)} rows of MaxText's training batches", flush=True)
