"""Stage fit_check: does the training configuration fit the TPU's memory? Answered without one.

    python -m stages.fit_check                                  # the recipe as it is
    python -m stages.fit_check --search per_device_batch_size   # the largest batch that fits
    python -m stages.fit_check --search max_target_length       # the longest rows that fit

Compiles the train step for the recipe's topology (`hardware.kind`, e.g. v6e-8) with
MaxText's ahead-of-time compiler (`maxtext.trainers.pre_train.train_compile`) and libtpu, on
whatever machine it runs on: a CPU box will do (gemma3-4b: ~4 min, ~6 GB RAM). XLA's memory
analysis gives, per chip, the arguments (parameters and optimizer state), temporaries and
code; metrics/fit_check.json records them with the share of HBM and the headroom. A
configuration that would not fit fails here, saying by how much, instead of on the TPU.
As a DVC stage it runs before `train`; the compile and its verdict are stages/lib/fit.py's
(the preference stage checks its own fit with them). It compiles MaxText's pre-training step, which has the
same model, optimizer and batch shapes as the SFT step: a close proxy for fit, not an exact one.
CPU recipes have nothing to compile; the stage records that and passes.
"""

import argparse
import os

from stages.lib import outputs
from stages.lib.cli import run
from stages.lib.fit import DoesNotFit, compile_once, largest_fitting
from stages.lib.params import load
from stages.shared.errors import UserError

METRICS = os.path.join("metrics", "fit_check.json")


def search(params: dict, key: str) -> None:
    """The largest train.<key> that fits, each probe one real compile."""

    def fits(value: int) -> bool:
        try:
            report = compile_once(params, {key: value})
        except DoesNotFit as e:
            print(f"fit_check: {key}={value} does not fit ({e})", flush=True)
            return False
        print(f"fit_check: {key}={value} fits ({report['hbm_used_percent']:.0f}% of HBM)", flush=True)
        return True

    quantum = 1 if key == "per_device_batch_size" else 256  # sequence lengths in whole blocks
    fits_at, fails_at = largest_fitting(params.train[key], quantum, fits)
    if fits_at == 0:
        raise DoesNotFit(f"no {key} fits, not even {fails_at}")
    print(f"fit_check: the largest {key} that fits is {fits_at}: set train.{key}: {fits_at} in params.yaml")


def does_not_fit(params: dict, why: DoesNotFit) -> DoesNotFit:
    """The stage's one line for a recipe that would not fit: what, by how much, what next."""
    t = params.train
    return DoesNotFit(
        f"train.per_device_batch_size={t['per_device_batch_size']}, max_target_length={t['max_target_length']} "
        f"does not fit a {params['hardware']['kind']}: {why}. Find what does: "
        "python -m stages.fit_check --search per_device_batch_size"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.fit_check")
    parser.add_argument("--search", choices=["per_device_batch_size", "max_target_length"])
    args = parser.parse_args()
    params = load()
    kind = params.hardware.kind
    if kind == "cpu":
        if args.search:
            raise UserError("hardware.kind is cpu: there is no accelerator memory to search")
        outputs.write_json(METRICS, {"fit": {"applicable": False, "reason": "hardware.kind is cpu"}})
        print("fit_check: hardware.kind is cpu, nothing to compile", flush=True)
        return
    if args.search:
        search(params, args.search)
        return
    try:
        report = compile_once(params)
    except DoesNotFit as e:
        raise does_not_fit(params, e) from None
    outputs.write_json(
        METRICS, {"fit": {"applicable": True, "hardware": kind, **report}}
    )  # fit.* in `dvc metrics show`
    g = report["per_chip_gib"]
    print(
        f"fit_check: fits a {kind}: {g['total']:.1f} of {report['hbm_gib']:.0f} GiB per chip "
        f"({report['hbm_used_percent']:.0f}%: arguments {g['arguments']:.1f}, temporaries {g['temporaries']:.1f}, "
        f"code {g['code']:.2f}); headroom {report['headroom_gib']:.1f} GiB",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "fit_check")
