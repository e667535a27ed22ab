"""The Hugging Face token reaches no file, command line or MaxText process."""

import pytest

from testkit.process_watch import CANARY_TOKEN

pytestmark = pytest.mark.slow


def test_canary_token_is_in_no_process_argv_or_maxtext_environment(tiny_run):
    commands = tiny_run.watch.seen_commands
    for stage in ("base_model", "dataset", "convert_in", "train", "convert_out"):
        assert any(f"stages.{stage}" in c for c in commands), f"the watch never saw stage {stage} run"
    assert any("stages.in_maxtext.main" in c for c in commands)
    assert tiny_run.watch.leaks == []


def test_canary_token_is_in_no_file_under_the_workspace_or_the_compile_cache(tiny_run, jax_cache):
    needle = CANARY_TOKEN.encode()
    scanned = 0
    for path in [*tiny_run.path.rglob("*"), *jax_cache.rglob("*")]:
        if path.is_symlink() or not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # a temporary file of a run in a clone (they share this DVC cache)
            continue
        scanned += 1
        assert needle not in data, f"the HF token was written to {path}"
    assert scanned > 100  # dvc.lock, .dvc/cache, logs/, metrics/, models/, compiled programs ...
    assert list(jax_cache.iterdir()), "the run compiled nothing into the shared cache"
    assert CANARY_TOKEN not in tiny_run.output
