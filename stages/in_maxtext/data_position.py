"""How many training conversations MaxText's SFT input pipeline consumed in its first N steps.

Run by the train stage before resuming (through stages.in_maxtext.main, for MaxText's
environment), on CPU, with as many simulated devices as the recipe's accelerator has:

    python -m stages.in_maxtext.main stages.in_maxtext.data_position --setup '{...}' \
        --request '{"steps": 20, "report": "R.json", "streams": ["host-000.jsonl", ...]}' \
        -- <sft.yml and the run's MaxText flags (stages/lib/flags.py)>

MaxText's SFT (through Tunix's data hooks) restarts its input pipeline from the first row on
resume instead of where it stopped. The train stage feeds MaxText an explicit data stream
(shuffled by the stage, not by MaxText), so resuming at the right place means starting that
stream after the rows the first N steps packed. This replays MaxText's own pipeline (same
tokenizer, template, packing, batch size) for those steps and counts the rows in them: each
packed row numbers its conversations 1..n in `inputs_segmentation`.

A job of several processes reads one stream per host (stages/lib/stream.py): each is replayed
on its own, as that host's pipeline read it (one process, the host's devices), with
the request's `streams` (one count per stream, in the report's "rows" list).
"""

import json
import sys

from stages.shared import contract

REQUEST = contract.DataPosition


def training_batches(maxtext_args: list[str]):
    """MaxText's SFT training batches for these flags, as its trainer receives them (one per
    micro-step): (config, an iterator of {name: numpy array}: inputs, targets, their
    segmentation (0 = padding, or a target not trained on) and positions)."""
    import jax
    import numpy as np
    from maxtext.configs import pyconfig
    from maxtext.input_pipeline import hf_data_processing
    from maxtext.utils import maxtext_utils

    config = pyconfig.initialize_pydantic(["data_position", *maxtext_args])
    mesh = maxtext_utils.get_mesh_from_config(config)
    batches = hf_data_processing.make_hf_train_iterator(config, mesh, [jax.process_index()])
    return config, ({name: np.asarray(value) for name, value in batch.items()} for batch in batches)


def consumed_rows(maxtext_args: list[str], steps: int) -> int:
    config, batches = training_batches(maxtext_args)
    segmentations = (batch["inputs_segmentation"] for batch in batches)
    micro_batches = steps * max(1, config.gradient_accumulation_steps)  # Tunix takes one per micro-step
    rows = 0
    for _ in range(micro_batches):
        segments = next(segmentations)
        rows += int(segments.max(axis=1).sum()) if config.packing else int((segments.max(axis=1) > 0).sum())
    return rows


def run(request: contract.DataPosition, maxtext_flags: list[str], setup: contract.Setup) -> None:
    from absl import flags

    flags.FLAGS(sys.argv[:1])  # Grain's data workers read absl flags, which MaxText's app.run would parse
    if request.streams:
        replays = [
            [a for a in maxtext_flags if not a.startswith("hf_train_files=")] + [f"hf_train_files={s}"]
            for s in request.streams
        ]
        rows = [consumed_rows(flags_of_host, request.steps) for flags_of_host in replays]
    else:
        rows = consumed_rows(maxtext_flags, request.steps)
    with open(request.report, "w") as f:
        json.dump({"steps": request.steps, "rows": rows}, f)
    print(f"data_position: the first {request.steps} steps consumed {rows} rows", flush=True)
