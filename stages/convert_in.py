"""Stage convert_in: the base HF checkpoint converted to a MaxText (Orbax) checkpoint.

    python -m stages.convert_in             # run
    python -m stages.convert_in --dry-run   # print the MaxText command, have MaxText validate it

Runs MaxText's `maxtext.checkpoint_conversion.to_maxtext` on models/base-hf/ and writes
models/base-maxtext/ (the parameters are at models/base-maxtext/0/items). MaxText takes the
architecture from its hard-coded table; stages/lib/maxtext_main.py substitutes the
checkpoint's own config.json and reads the Hub's tensor names, so what is converted is
exactly the model that was downloaded.
"""

import os
import sys

from stages.lib import gemma3, hardware, maxtext, outputs, paths
from stages.lib.cli import StageFailed, run
from stages.lib.params import load

BASE = paths.BASE_HF
OUT = paths.BASE_MAXTEXT
MODULE = "maxtext.checkpoint_conversion.to_maxtext"


def params_path(checkpoint_dir: str) -> str:
    """Where to_maxtext puts the parameters inside its output directory."""
    return os.path.join(checkpoint_dir, "0", "items")


def maxtext_args(params: dict, out_dir: str) -> list[str]:
    m = params["model"]
    return maxtext.common_args(params, BASE) + [
        "use_multimodal=false",  # text SFT; the vision tower is carried over by convert_out
        f"base_output_directory={out_dir}",
        "run_name=convert_in",
        f"checkpoint_storage_use_ocdbt={maxtext.flag(m['checkpoint_ocdbt'])}",
        f"checkpoint_storage_use_zarr3={maxtext.flag(m['checkpoint_zarr3'])}",
        f"--hf_model_path={BASE}",
        "--lazy_load_tensors=true",  # one tensor at a time: RAM stays ~1 GB + the largest tensor
        f"--save_dtype={params['convert_in']['save_dtype']}",
    ]


def main() -> None:
    params = load()
    layout = gemma3.check_convertible(BASE, params["model"]["maxtext_name"])
    if "--dry-run" in sys.argv:
        maxtext.dry_run("convert_in", MODULE, maxtext_args(params, os.path.abspath(OUT)), params, hf_config=BASE, hf_layout=layout)
        return
    hardware.check_present(params)
    hardware.check_output_disk(OUT, 1.1 * gemma3.parameter_count(BASE) * gemma3.DTYPE_BYTES[params["convert_in"]["save_dtype"]],
                               "the MaxText checkpoint")
    with outputs.staged_dir(OUT) as tmp:
        maxtext.run(
            "convert_in", MODULE, maxtext_args(params, tmp), params, hf_config=BASE, hf_layout=layout,
            progress=maxtext.log_progress(os.path.join(maxtext.LOG_DIR, "convert_in.log"), "converting weights:"),
            progress_every=10.0,
        )
        if not os.path.exists(os.path.join(params_path(tmp), "commit_success.txt")):
            raise StageFailed(f"{MODULE} exited 0 but wrote no complete checkpoint (no commit_success.txt)")
    print(f"convert_in: wrote {OUT}", flush=True)


if __name__ == "__main__":
    run(main, "convert_in")
