"""Switches the recipe that params.yaml holds.

    python -m tools.recipe                     # list recipes; say which one params.yaml is
    python -m tools.recipe tiny                # the CPU demo: tiny Gemma 3, local chat data
    python -m tools.recipe gemma3-4b-v6e-8     # the default: Gemma 3 4B SFT on a TPU v6e-8 VM
    python -m tools.recipe tiny-qwen3          # another family's tiny model (README, "Model families")

A recipe is a complete params file under recipes/; switching copies it over params.yaml
(after validating it), and `dvc repro` then re-runs exactly what the change affects. Edit
params.yaml freely afterwards, or use `dvc exp run -S key=value` for variants.
"""

import filecmp
import os
import shutil
import sys

from stages.lib.cli import UserError, run
from stages.lib.params import PARAMS_FILE, load

RECIPES_DIR = "recipes"


def recipes() -> dict[str, str]:
    return {f[: -len(".yaml")]: os.path.join(RECIPES_DIR, f) for f in sorted(os.listdir(RECIPES_DIR)) if f.endswith(".yaml")}


def current() -> str | None:
    return next((name for name, path in recipes().items() if filecmp.cmp(path, PARAMS_FILE, shallow=False)), None)


def main() -> None:
    available = recipes()
    if len(sys.argv) < 2:
        now = current()
        for name in available:
            print(f"{'*' if name == now else ' '} {name}")
        if now is None:
            print(f"({PARAMS_FILE} matches no recipe: it has been edited)")
        return
    name = sys.argv[1]
    if name not in available:
        raise UserError(f"no recipe {name!r}; choose one of: {', '.join(available)}")
    load(available[name])  # never install an invalid recipe
    shutil.copyfile(available[name], PARAMS_FILE)
    print(f"params.yaml is now the {name} recipe; run: dvc repro")


if __name__ == "__main__":
    run(main, "recipe")
