"""Switches the recipe that params.yaml holds.

    python -m tools.recipe                     # list recipes; say which one params.yaml is
    python -m tools.recipe tiny                # the CPU demo: tiny Gemma 3, local chat data
    python -m tools.recipe gemma3-4b-v6e-8     # the default: Gemma 3 4B SFT on a TPU v6e-8 VM
    python -m tools.recipe tiny-qwen3          # another family's tiny model (docs/families.md)

A recipe under recipes/ states only what differs from the recipe it `extends`; the chain ends
at recipes/gemma3-4b-v6e-8.yaml, the tutorial's workload, which is complete (and, with its
comments, what the committed params.yaml is, byte for byte). Switching writes the whole
params file (after validating it) over params.yaml, since DVC tracks every key there; `dvc
repro` then re-runs exactly what the change affects. Edit params.yaml freely afterwards, or
use `dvc exp run -S key=value` for variants.
"""

import argparse
import os

import yaml

from stages.lib import outputs
from stages.lib.cli import run
from stages.lib.params import PARAMS_FILE, load
from stages.shared.errors import UserError

RECIPES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
EXTENDS = "extends"


def recipes() -> dict[str, str]:
    return {
        f[: -len(".yaml")]: os.path.join(RECIPES_DIR, f) for f in sorted(os.listdir(RECIPES_DIR)) if f.endswith(".yaml")
    }


class Replace(dict):
    """A mapping tagged `!replace` in a recipe: it replaces the one it extends instead of
    merging into it (a gate naming other tasks than the parent's: recipes/small-chat.yaml)."""


class RecipeLoader(yaml.SafeLoader):
    pass


RecipeLoader.add_constructor("!replace", lambda loader, node: Replace(loader.construct_mapping(node, deep=True)))


def read(path: str) -> dict:
    with open(path) as f:
        return yaml.load(f, Loader=RecipeLoader) or {}


def overlay(base: dict, changes: dict) -> dict:
    """`base` with `changes` applied key by key: a mapping merges into a mapping (unless it is
    tagged `!replace`), anything else (a value, a list, null) replaces what was there."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Replace):
            out[key] = dict(value)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = overlay(base[key], value)
        else:
            out[key] = value
    return out


def chain(name: str) -> list[str]:
    """The recipe and those it extends, the complete one first."""
    available, seen = recipes(), [name]
    while True:
        if seen[-1] not in available:
            raise UserError(
                f"no recipe {seen[-1]!r}"
                + (f" (extended by {seen[-2]})" if len(seen) > 1 else "")
                + f"; choose one of: {', '.join(available)}"
            )
        parent = read(available[seen[-1]]).get(EXTENDS)
        if parent is None:
            return seen[::-1]
        if parent in seen:
            raise UserError(
                f"recipes/{seen[-1]}.yaml: {EXTENDS}: {parent} extends it in turn; a recipe chain ends at a complete "
                "recipe"
            )
        seen.append(parent)


def params_text(name: str) -> str:
    """The params file a recipe stands for: the complete recipe's own text, or, for one that
    extends another, the merged keys under a header that says where they came from."""
    names = chain(name)
    paths = [recipes()[n] for n in names]
    if len(names) == 1:
        with open(paths[0]) as f:
            return f.read()
    merged: dict = {}
    for path in paths:
        merged = overlay(merged, {k: v for k, v in read(path).items() if k != EXTENDS})
    header = (
        f"# The {name} recipe, written by `python -m tools.recipe {name}`: recipes/{names[-1]}.yaml"
        + "".join(f"\n# over recipes/{n}.yaml" for n in reversed(names[:-1]))
        + ". Their comments say why each value is what it is.\n\n"
    )
    return header + yaml.safe_dump(merged, sort_keys=False, allow_unicode=True, width=1000)


def current() -> str | None:
    try:
        with open(PARAMS_FILE) as f:
            text = f.read()
    except OSError:
        return None
    return next((name for name in recipes() if params_text(name) == text), None)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.recipe", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", help="the recipe to switch to (none: list them)")
    wanted = parser.parse_args().recipe
    available = recipes()
    if wanted is None:
        now = current()
        for name in available:
            print(f"{'*' if name == now else ' '} {name}")
        if now is None:
            print(f"({PARAMS_FILE} matches no recipe: it has been edited)")
        return
    name = wanted
    if name not in available:
        raise UserError(f"no recipe {name!r}; choose one of: {', '.join(available)}")
    text = params_text(name)
    tmp = f"{PARAMS_FILE}.recipe-{os.getpid()}"
    outputs.write_text(tmp, text)
    try:
        load(tmp)  # never install an invalid recipe
    except UserError:
        os.remove(tmp)
        raise
    os.replace(tmp, PARAMS_FILE)
    print(f"params.yaml is now the {name} recipe; run: dvc repro")


if __name__ == "__main__":
    run(main, "recipe")
