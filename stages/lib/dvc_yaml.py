"""What dvc.yaml says, for the code that needs it: which params and deps a stage declares
(the train stage's working directory is named by them: stages/lib/workdir.py; the tests hold
every key a stage reads against them), and the stages in pipeline order (tools/summary.py)."""

import yaml


def _stages(dvc_yaml: str) -> dict:
    with open(dvc_yaml) as f:
        return yaml.safe_load(f)["stages"]


def declared(stage: str, dvc_yaml: str = "dvc.yaml") -> tuple[list[str], list[str]]:
    """(params keys, dependency paths) that dvc.yaml declares for a stage."""
    spec = _stages(dvc_yaml)[stage]
    keys = [k for entry in spec.get("params", []) for k in ([entry] if isinstance(entry, str) else entry)]
    return keys, list(spec.get("deps", []))


def stage_names(dvc_yaml: str = "dvc.yaml") -> list[str]:
    """The stages, in the order dvc.yaml lists them (the order they run in)."""
    return list(_stages(dvc_yaml))
