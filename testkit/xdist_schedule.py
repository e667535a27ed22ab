"""How the suite's tests are spread over pytest-xdist's workers: a pytest plugin
(tests/conftest.py loads it).

scripts/test.sh runs two workers (a pipeline test spends much of its time in single-threaded
work: imports, DVC, Python loops, so two share the 2 cores well). Each test file runs whole on
one worker (`--dist loadscope` with a file, or a group of files, as the scope), the longest
first. The scheduler refines xdist's LoadScopeScheduling through its private members
(`_pending_of`, `_assign_work_unit`, `workqueue`, `assigned_work`); should a new xdist lack
one, it falls back to plain loadscope (or, at run time, to loadscope's own rescheduling),
which still keeps every group on one worker.
"""

# Files whose tests change a shared fixture run on one worker: both `dvc exp apply` in the
# experiments' workspace; the others run commands in tiny_run's own workspace (DVC's lock
# is per workspace) or read every file in it.
SAME_WORKER = {
    "test_golden.py": "test_experiments.py",
    **dict.fromkeys(["test_plots.py", "test_publish.py", "test_export.py", "test_secrets.py"], "test_pipeline.py"),
}
# The longest files first (minutes, measured), so that the two workers end together. The
# second needs no tiny_run: it runs while the first worker builds it. test_remote.py (DVC
# processes, waits on a stopped server) between the grid and the two-process jobs, each of
# which runs two or three JAX processes at once: side by side, five or six on two cores, each
# took ~100 s longer (2026-12-06).
LONGEST_FIRST = [
    "test_small.py",
    "test_faults.py",
    "test_experiments.py",
    "test_remote.py",
    "test_multihost.py",
    "test_preference.py",
    # Its 4B recipe's benchmarks (~100-275 s), last in file order, ran alone at the end (2026-12-06).
    "test_benchmark.py",
    "test_tpu_recipe.py",
    "test_pipeline.py",
    "test_tiny_family_runs_the_whole_pipeline",
    # Not long, but last in file order they left one worker ~100 s alone at the end (2026-12-06).
    "test_gguf_export.py",
    "test_slice.py",
    "test_roundtrip.py",
]


# Tests that share nothing with the rest of their file and each run a whole pipeline: each
# is a unit of its own, so that either worker takes the next one.
OWN_UNIT = ("test_tiny_family_runs_the_whole_pipeline[",)


def file_group(path_or_nodeid: str) -> str:
    """The unit one worker runs whole: a test file, or the files it shares a worker with."""
    path, _, test = str(path_or_nodeid).partition("::")
    if test.startswith(OWN_UNIT):
        return test
    name = path.rsplit("/", 1)[-1]
    return SAME_WORKER.get(name, name)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: the rest in file order
    items.sort(key=lambda item: rank.get(file_group(item.nodeid).split("[", 1)[0], len(rank)))


PRIVATE_MEMBERS_USED = ("_pending_of", "_assign_work_unit", "_split_scope", "_reschedule")


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope`, with a file (or its SAME_WORKER group) as the scope. (Not
    `--dist loadgroup` with marks: with pytest 9.2 it silently stops grouping,
    pytest-dev/pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    if not all(hasattr(LoadScopeScheduling, name) for name in PRIVATE_MEMBERS_USED):
        return None  # xdist's own loadscope

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return file_group(nodeid)

        def _reschedule(self, node) -> None:
            # xdist hands a worker its next unit while the worker still has two tests to run;
            # with tests of minutes that bound two more pipeline files to one busy worker
            # while the other ran out of work (a 4-minute tail, measured). One pending test
            # is the least that keeps a worker going: it runs a test only once it knows the next.
            try:
                if node.shutting_down:
                    return
                if not self.workqueue:
                    node.shutdown()
                    return
                pending = self._pending_of(self.assigned_work[node])
            except AttributeError:  # xdist's internals changed: its own rescheduling
                super()._reschedule(node)
                return
            if pending <= 1:
                self._assign_work_unit(node)

    return ByFile(config, log)
