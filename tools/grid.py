"""Queues a grid of experiments, each named after what it changes.

    python -m tools.grid train.learning_rate=1e-3,3e-4 train.steps=40,80   # 4 experiments
    dvc queue start                  # one worker: one accelerator
    dvc exp show --only-changed      # compare; then: dvc exp apply NAME

Every combination becomes `dvc exp run --queue -n NAME -S KEY=VALUE ...`, with NAME spelling
the values (e.g. `lr3e-4-steps80`; a switch by its section: `train.lora.enabled=true,false`
gives `lora` and `no-lora`), so `dvc exp show` rows say what they are.
"""

import copy
import itertools
import subprocess
import sys

from dvc.utils.hydra import to_hydra_overrides
from hydra.errors import OverrideParseException

from stages.lib.cli import run
from stages.lib.params import load, plain, validate
from stages.shared.errors import UserError

# Short names for the params people sweep; anything else uses its last key.
ABBREVIATIONS = {
    "learning_rate": "lr",
    "per_device_batch_size": "bs",
    "gradient_accumulation_steps": "ga",
    "max_target_length": "len",
    "warmup_steps_fraction": "warmup",
    "rank": "lora-r",
}


def experiment_name(assignment: list[tuple[str, str]]) -> str:
    parts = []
    for key, value in assignment:
        *parents, leaf = key.split(".")
        if leaf == "enabled" and parents and value.lower() in ("true", "false"):
            # `lora` / `no-lora`, not `enabledtrue`
            parts.append(
                parents[-1].replace("_", "-") if value.lower() == "true" else f"no-{parents[-1].replace('_', '-')}"
            )
            continue
        parts.append(f"{ABBREVIATIONS.get(leaf, leaf.replace('_', '-'))}{value}")
    name = "-".join(parts)
    return "".join(c if c.isalnum() or c in "-." else "-" for c in name)  # a valid git ref name


def with_values(params: dict, assignment) -> dict:
    """params with KEY=VALUE applied, VALUE parsed as `dvc exp run -S` parses it (Hydra's
    override grammar: 1e-3 is a float, unlike in YAML)."""
    params = copy.deepcopy(params)
    for key, value in assignment:
        *parents, leaf = key.split(".")
        node = params
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"{key}: {part} is a value, not a section of params.yaml")
        try:
            node[leaf] = to_hydra_overrides([f"{key}={value}"])[0].value()
        except OverrideParseException as e:
            raise UserError(
                f"{key}={value}: not a value `dvc exp run -S` can parse: {str(e).splitlines()[0]}"
            ) from None
    return params


def main() -> None:
    axes = []
    for arg in sys.argv[1:]:
        key, _, values = arg.partition("=")
        if not values:
            raise UserError(f"{arg!r}: expected KEY=VALUE[,VALUE...], e.g. train.learning_rate=1e-3,3e-4")
        axes.append([(key, v) for v in values.split(",")])
    if not axes:
        raise UserError("usage: python -m tools.grid KEY=V1,V2 [KEY=V1,V2 ...]")
    params = plain(load())  # refuse to queue anything from an invalid params.yaml ...
    grid = list(itertools.product(*axes))
    for assignment in grid:  # ... or any variant that would fail at its first second
        validate(with_values(params, assignment), " ".join(f"{k}={v}" for k, v in assignment))
    for assignment in grid:
        name = experiment_name(list(assignment))
        sets = [f"{k}={v}" for k, v in assignment]
        cmd = ["dvc", "exp", "run", "--queue", "-n", name, "-m", "grid: " + ", ".join(sets)]
        for s in sets:
            cmd += ["-S", s]
        subprocess.run(cmd, check=True)
        print(f"grid: queued {name}  ({', '.join(sets)})", flush=True)
    print("grid: run them with: dvc queue start   (then: dvc queue status, dvc exp show)")


if __name__ == "__main__":
    run(main, "grid")
