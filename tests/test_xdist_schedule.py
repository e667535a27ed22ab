"""The scheduler plugin (testkit/xdist_schedule.py): its units, its order, and its fallback to
xdist's own loadscope when xdist's private members are not what it expects."""

from types import SimpleNamespace

from xdist.scheduler import LoadScopeScheduling

from testkit import xdist_schedule


def config(dist: str):
    return SimpleNamespace(getvalue=lambda name: dist)


def test_a_unit_is_a_file_its_group_or_a_test_of_its_own():
    assert xdist_schedule.file_group("tests/test_stream.py::test_x") == "test_stream.py"
    assert xdist_schedule.file_group("tests/test_golden.py::test_y") == "test_experiments.py"
    own = "tests/test_families.py::test_tiny_family_runs_the_whole_pipeline[tiny-qwen3]"
    assert xdist_schedule.file_group(own) == "test_tiny_family_runs_the_whole_pipeline[tiny-qwen3]"


def test_the_longest_files_come_first_the_rest_in_file_order():
    items = [
        SimpleNamespace(nodeid=n) for n in ("tests/test_a.py::t", "tests/test_pipeline.py::t", "tests/test_small.py::t")
    ]
    xdist_schedule.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/test_small.py::t", "tests/test_pipeline.py::t", "tests/test_a.py::t"]


def test_it_schedules_loadscope_only_and_falls_back_when_xdist_changes(monkeypatch):
    assert xdist_schedule.pytest_xdist_make_scheduler(config("load"), None) is None
    log = SimpleNamespace(loadscopesched=lambda *a: None)
    made = xdist_schedule.pytest_xdist_make_scheduler(config("loadscope"), log)
    assert isinstance(made, LoadScopeScheduling) and type(made) is not LoadScopeScheduling
    monkeypatch.delattr(LoadScopeScheduling, "_pending_of")
    assert xdist_schedule.pytest_xdist_make_scheduler(config("loadscope"), log) is None  # xdist's own
