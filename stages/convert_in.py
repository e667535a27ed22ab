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

from stages.lib import checkpoint, families, flags, hardware, maxtext, outputs, paths
from stages.lib.cli import StageFailed, run
from stages.lib.params import load

OUT = paths.BASE_MAXTEXT


def main() -> None:
    params = load()
    families.check_convertible(paths.BASE_HF, params["model"]["maxtext_name"])
    if "--dry-run" in sys.argv:
        maxtext.dry_run("convert_in", flags.convert_in(params, OUT), params)
        return
    hardware.check_present(params)
    size = checkpoint.parameter_count(paths.BASE_HF) * checkpoint.DTYPE_BYTES[params["convert_in"]["save_dtype"]]
    hardware.check_output_disk(OUT, 1.1 * size, "the MaxText checkpoint")
    with outputs.staged_dir(OUT) as tmp:
        maxtext.run("convert_in", flags.convert_in(params, tmp), params,
                    progress=maxtext.log_progress("convert_in", "converting weights:"), progress_every=5.0)
        if not os.path.exists(os.path.join(paths.converted_params(tmp), "commit_success.txt")):
            raise StageFailed(f"{flags.TO_MAXTEXT} exited 0 but wrote no complete checkpoint (no commit_success.txt)")
    print(f"convert_in: wrote {OUT}", flush=True)


if __name__ == "__main__":
    run(main, "convert_in")
