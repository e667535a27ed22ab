"""tools/grid.py's pure part: the experiments a grid expands to, their names, their values.
(Queuing and running a grid: tests/test_experiments.py; refusing a bad one: tests/test_bad_input.py.)"""

from tools.grid import experiment_name, with_values


def test_names_spell_what_each_variant_changes():
    assert experiment_name([("train.learning_rate", "3e-4"), ("train.steps", "80")]) == "lr3e-4-steps80"
    assert experiment_name([("train.lora.enabled", "true"), ("train.learning_rate", "5e-3")]) == "lora-lr5e-3"
    assert experiment_name([("train.lora.enabled", "False")]) == "no-lora"
    assert experiment_name([("benchmark.max_new_tokens", "8")]) == "max-new-tokens8"
    assert experiment_name([("train.lora.module_path", ".*/query")]) == "module-path.--query"  # a valid git ref


def test_values_are_parsed_as_dvc_exp_run_parses_them():
    params = {"train": {"learning_rate": 1e-3, "lora": {"enabled": False}}}
    changed = with_values(params, [("train.learning_rate", "5e-3"), ("train.lora.enabled", "true")])
    assert changed["train"] == {"learning_rate": 5e-3, "lora": {"enabled": True}}  # a float and a bool, not strings
    assert params["train"]["learning_rate"] == 1e-3  # the original untouched
