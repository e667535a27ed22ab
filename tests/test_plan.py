"""tools.plan, the cost preview: its parameter counts against the published ones, its save
schedule, and what it says about the committed recipes. Its byte figures against a real run's
files: tests/test_pipeline.py."""

import re

import pytest
import yaml

from stages.lib.params import validate
from stages.shared.errors import UserError
from tools import plan, recipe


def recipe_params(name: str) -> dict:
    return validate(yaml.safe_load(recipe.params_text(name)), name)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama3.1-8b-v6e-8", 8_030_261_248),  # meta-llama/Llama-3.1-8B's safetensors
        ("gemma3-4b-v6e-8", 3_880_263_168),  # gemma-3-4b-it's language model (vocabulary 262,208 there)
    ],
)
def test_parameter_counts_from_maxtexts_configs_match_the_published_ones(name, published):
    dims = plan.dimensions(recipe_params(name), "/nonexistent")
    assert abs(plan.language_parameters(dims) - published) / published < 0.001


def test_saves_are_every_period_and_the_end():
    assert plan.save_steps(1000, 1000) == [1000]
    assert plan.save_steps(1000, 200) == [200, 400, 600, 800, 1000]
    assert plan.save_steps(50, 20) == [20, 40, 50]


def test_the_4b_recipe_saves_once_into_ram_and_fits_the_boot_disk(capsys):
    plan.main(["--recipe", "gemma3-4b-v6e-8", "--base-hf", "/nonexistent"])
    out = capsys.readouterr().out
    assert "checkpoint saves at steps 1000: 1 x 46.6 GB into /dev/shm" in out
    assert "does not fit" not in out and "assumed: mfu=0.35" in out


def test_a_recipe_that_overflows_the_boot_disk_is_flagged(capsys):
    plan.main(["--recipe", "gemma3-27b-v6e-32", "--base-hf", "/nonexistent"])
    assert "does not fit" in capsys.readouterr().out


def test_a_recipe_whose_base_is_built_here_needs_the_base_model_stage_first():
    with pytest.raises(UserError, match=r"run `dvc repro base_model` first"):
        plan.dimensions(recipe_params("small"), "/nonexistent")


def test_the_dpo_recipe_adds_the_preference_stage_and_its_saves(capsys):
    plan.main(["--recipe", "gemma3-4b-v6e-8-dpo", "--base-hf", "/nonexistent"])
    out = capsys.readouterr().out
    assert "preference" in out and "checkpoint saves at steps 477: 1 x 46.6 GB into /dev/shm" in out
    assert "the reference model's forward over every pair, each step" in out
    p = plan.plan(recipe_params("gemma3-4b-v6e-8-dpo"), plan.dimensions(recipe_params("gemma3-4b-v6e-8"), "/x"))
    sft = plan.plan(recipe_params("gemma3-4b-v6e-8"), plan.dimensions(recipe_params("gemma3-4b-v6e-8"), "/x"))
    assert [s["stage"] for s in p["stages"]][2:5] == ["train", "preference", "convert_out"]
    # its parameters stay on the boot disk beside the SFT model's
    assert p["boot_disk_peak"] - sft["boot_disk_peak"] == p["stages"][3]["trained_params"]


def test_a_grids_cost_counts_the_shared_stages_once_and_spreads_the_rest(capsys):
    params = recipe_params("gemma3-4b-v6e-8")
    d = plan.dimensions(params, "/nonexistent")
    variants = {"steps1000": ["train.steps=1000"], "steps2000": ["train.steps=2000"], "steps3000": ["train.steps=3000"]}
    said = plan.grid_cost(params, d, variants, workers=2)
    minutes = {m[0]: float(m[1]) for m in re.findall(r"  (\S+): ~([0-9.]+) min", said)}
    # A longer training is a longer variant; its share of the shared stages is none.
    assert minutes["steps1000"] < minutes["steps2000"] < minutes["steps3000"]
    once = float(re.search(r"run once: .*: ~([0-9.]+) min", said).group(1))
    base = plan.plan(params, d)
    shared_by_hand = sum(plan.seconds(s, base) for s in base["stages"] if s["stage"] in ("base_model", "convert_in"))
    assert once == pytest.approx(shared_by_hand / 60, abs=0.06)
    # Two workers: 3000 on one, 1000 + 2000 on the other, after the shared stages.
    wall = float(re.search(r"wall: ~([0-9.]+) min on 2 workers", said).group(1))
    assert wall == pytest.approx(once + max(minutes["steps3000"], minutes["steps1000"] + minutes["steps2000"]), abs=0.2)
    saved = float(re.search(r"save ([0-9.]+) chip-hours", said).group(1))
    assert saved == pytest.approx(2 * once / 60 * 8, abs=0.02)  # two variants fewer ran them, 8 chips each
    plan.main(["--recipe", "gemma3-4b-v6e-8", "--base-hf", "/nonexistent", "--grid", "train.steps=1000,2000"])
    assert "2 variants on 1 worker of v6e-8" in capsys.readouterr().out
