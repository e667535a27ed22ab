"""Writes a parameter checkpoint again in another dtype: the train stage's final parameters in
train.save_dtype (MaxText trains and checkpoints them in float32).

Run by the train stage (through stages.in_maxtext.main, for MaxText's environment):

    python -m stages.in_maxtext.main stages.in_maxtext.cast_params --setup '{...}' --request \
        '{"source": "<params>", "out": OUT, "dtype": "bfloat16"}' --

Why bfloat16: the export (convert_out.dtype bfloat16) rounds every weight to bfloat16 once,
and rounding here first gives it the same numbers; the parameters are half the bytes to keep,
push and pull (a TPU VM's run handed to a CPU machine: docs/tpu-vm.md). MaxText reads them back
into float32 wherever it loads them (load_parameters_path), as it reads a bfloat16 convert_in.
"""

import os

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp

from stages.in_maxtext.merge_lora import restore_numpy
from stages.shared import contract

REQUEST = contract.CastParams
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def run(request: contract.CastParams, maxtext_flags: list[str], setup: contract.Setup) -> None:
    dtype = DTYPES[request.dtype]
    tree = restore_numpy(request.source)
    cast = jax.tree.map(lambda x: x.astype(dtype) if np.issubdtype(x.dtype, np.floating) else x, tree)
    ocp.PyTreeCheckpointer().save(os.path.abspath(request.out), cast)
    count = len(jax.tree.leaves(cast))
    print(f"cast_params: {count} arrays of {request.source} written in {request.dtype} to {request.out}", flush=True)
