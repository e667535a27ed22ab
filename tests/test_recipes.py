"""Recipes state only what differs from the recipe they extend; `python -m tools.recipe NAME`
writes the whole params file, the same keys and values as the complete recipes the project had
before (tests/data/golden/recipes.json: when a recipe changes on purpose, rewrite it with
`python -m tests.test_recipes` and read its diff)."""

import json
import sys

import pytest
import yaml

from stages.shared.errors import UserError
from testkit.workspace import DATA, REPO
from tools import recipe

GOLDEN = json.loads((DATA / "golden" / "recipes.json").read_text())


def leaves(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_every_recipe_writes_its_golden_params():
    assert sorted(recipe.recipes()) == sorted(GOLDEN)
    for name, expected in GOLDEN.items():
        assert yaml.safe_load(recipe.params_text(name)) == expected, name


def test_the_default_recipe_is_complete_and_written_as_it_is():
    (root,) = [n for n in recipe.recipes() if len(recipe.chain(n)) == 1]
    assert root == "gemma3-4b-v6e-8"
    assert recipe.params_text(root) == (REPO / "recipes" / f"{root}.yaml").read_text()


def test_a_recipe_that_extends_another_states_only_differences():
    for name, path in recipe.recipes().items():
        own = recipe.read(path)
        parent = own.pop(recipe.EXTENDS, None)
        if parent is None:
            continue
        inherited = leaves(yaml.safe_load(recipe.params_text(parent)))
        same = [k for k, v in leaves(own).items() if k in inherited and inherited[k] == v]
        assert same == [], f"recipes/{name}.yaml repeats {parent}'s {same}"


def test_switching_writes_the_whole_params_file_and_knows_it(tmp_path, monkeypatch):
    (tmp_path / "assets").symlink_to(REPO / "assets")  # the tiny recipes' data, which validation checks
    monkeypatch.chdir(tmp_path)
    for name in ("tiny-qwen3", "gemma3-4b-v6e-8"):
        monkeypatch.setattr(sys, "argv", ["recipe", name])
        recipe.main()
        assert (tmp_path / "params.yaml").read_text() == recipe.params_text(name)
        assert recipe.current() == name


def test_a_broken_chain_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe, "RECIPES_DIR", str(tmp_path))
    (tmp_path / "a.yaml").write_text("extends: b\n")
    (tmp_path / "b.yaml").write_text("extends: a\n")
    (tmp_path / "c.yaml").write_text("extends: nowhere\n")
    with pytest.raises(UserError, match=r"recipes/b.yaml: extends: a extends it in turn"):
        recipe.chain("a")
    with pytest.raises(UserError, match=r"no recipe 'nowhere' \(extended by c\)"):
        recipe.chain("c")


def test_a_mapping_tagged_replace_replaces_the_one_it_extends(tmp_path, monkeypatch):
    """A child's mapping merges into its parent's, key by key, unless tagged `!replace`."""
    monkeypatch.setattr(recipe, "RECIPES_DIR", str(tmp_path))
    (tmp_path / "a.yaml").write_text("gate:\n  x: {max_drop: 1}\nmore: {x: 1}\n")
    (tmp_path / "b.yaml").write_text("extends: a\ngate: !replace\n  y: {max_drop: 2}\nmore: {y: 2}\n")
    assert yaml.safe_load(recipe.params_text("b")) == {"gate": {"y": {"max_drop": 2}}, "more": {"x": 1, "y": 2}}


if __name__ == "__main__":
    golden = {name: yaml.safe_load(recipe.params_text(name)) for name in sorted(recipe.recipes())}
    (DATA / "golden" / "recipes.json").write_text(json.dumps(golden, indent=2) + "\n")
    print(f"wrote {DATA / 'golden' / 'recipes.json'}: {len(golden)} recipes")
