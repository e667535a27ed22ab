"""MaxText's profiler, as the tutorial runs it (profiler=xplane), through runtime.profile_steps:
a trace the profiler's own tools read, kept out of what DVC tracks."""

import json

import pytest

from testkit.workspace import set_param, sh

pytestmark = pytest.mark.slow


def test_a_profiled_run_leaves_a_trace_that_xprof_reads(tiny_run):
    from xprof.convert import raw_to_tool_data

    traces = sorted((tiny_run.path / "logs" / "profile" / "plugins" / "profile").rglob("*.xplane.pb"))
    assert traces, "no trace in logs/profile"
    assert "train: profile of 2 steps in logs/profile/" in tiny_run.output
    tools = raw_to_tool_data.xspace_to_tool_names([str(traces[0])])
    assert any(t.startswith("trace_viewer") for t in tools), tools  # "trace_viewer@": the streaming viewer
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(traces[0])], "trace_viewer", {})
    events = json.loads(data)["traceEvents"]
    assert any(e.get("name") == "PjitFunction(train_step)" for e in events), "the trace holds no training step"
    # Not a result: nothing DVC tracks holds it.
    assert not list((tiny_run.path / "models").rglob("*.xplane.pb"))
    assert "logs/profile" not in (tiny_run.path / "dvc.lock").read_text()


def test_profiling_on_or_off_reruns_nothing(clone_of_tiny_run):
    for steps in (0, 5):
        set_param(clone_of_tiny_run, "runtime.profile_steps", steps)
        assert json.loads(sh(["dvc", "status", "--json"], clone_of_tiny_run).stdout) == {}
