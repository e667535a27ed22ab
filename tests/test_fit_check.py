"""The fit check's verdicts (stages/fit_check.py) on compiler output recorded from real
ahead-of-time compiles of the committed 4B recipe for a v6e-8 (tests/data/fit_check/: the
lines of the logs that the stage reads; tests/test_tpu_recipe.py runs one compile for real)."""

import re

import pytest

from stages import fit_check
from stages.lib import fit
from testkit.sections import Sections
from testkit.workspace import DATA

HBM = 32 * fit.GIB  # a v6e chip
RECORDED = DATA / "fit_check"


def test_the_committed_recipe_fits_with_the_memory_xla_reported():
    report = fit.parse((RECORDED / "fits-batch-1.log").read_text(), HBM)
    g = report["per_chip_gib"]
    assert report["fits"] and 8 < g["total"] < 24 and g["arguments"] > 3  # f32 params + Adam state over 8 chips
    assert g["total"] == pytest.approx(g["arguments"] + g["temporaries"] + g["code"], abs=0.5)
    assert report["headroom_gib"] == pytest.approx(32 - g["total"])
    fit.raise_if_out_of_memory((RECORDED / "fits-batch-1.log").read_text())  # no false alarm


def test_an_absurd_batch_is_refused_saying_by_how_much():
    with pytest.raises(fit.DoesNotFit) as e:
        fit.raise_if_out_of_memory((RECORDED / "oom-batch-64.log").read_text())
    params = Sections(
        {"train": {"per_device_batch_size": 64, "max_target_length": 2048}, "hardware": {"kind": "v6e-8"}}
    )
    line = str(fit_check.does_not_fit(params, e.value))
    assert line.startswith("train.per_device_batch_size=64, max_target_length=2048 does not fit a v6e-8: its ")
    assert re.search(r"need [\d.]+ GiB per chip, over the chip's HBM \([\d.]+ GiB\) by [\d.]+ GiB", line), line
    assert line.endswith("Find what does: python -m stages.fit_check --search per_device_batch_size")


def test_a_total_over_the_hbm_does_not_fit_even_when_xla_compiled_it():
    line = (
        "Memory analysis: argument_size_in_bytes=30000000000 output_size_in_bytes=6000000000 "
        "alias_size_in_bytes=6000000000 temp_size_in_bytes=8000000000 generated_code_size_in_bytes=1000000"
    )
    with pytest.raises(fit.DoesNotFit, match=r"needs 35.4 GiB per chip, over the chip's HBM by 3.4 GiB"):
        fit.parse(line, HBM)
    with pytest.raises(fit.StageFailed, match="without a memory analysis"):
        fit.parse("compiled, but said nothing\n", HBM)


def test_a_finished_compile_killed_on_its_way_out_still_counts():
    """libtpu's exit watchdog killed a 4B compile after MaxText had printed everything (a
    busy 2-core machine, 2026-12-01): the figures are whole, so they are used; a compile
    that stopped before its memory analysis is still a failure."""
    finished = (RECORDED / "fits-batch-1.log").read_text() + (RECORDED / "killed-on-exit.log").read_text()
    assert fit.finished_before_failing(finished)
    assert fit.parse(finished, HBM)["fits"]
    assert not fit.finished_before_failing((RECORDED / "killed-on-exit.log").read_text())
    assert not fit.finished_before_failing((RECORDED / "oom-batch-64.log").read_text())


@pytest.mark.parametrize(
    "limit,quantum,start,expected",
    [(13, 1, 1, (13, 14)), (4, 1, 1, (4, 5)), (1, 1, 1, (1, 2)), (0, 1, 1, (0, 1)), (5000, 256, 2048, (4864, 5120))],
)
def test_the_search_finds_the_largest_value_that_fits(limit, quantum, start, expected):
    probed = []

    def fits(value):
        probed.append(value)
        return value <= limit

    assert fit.largest_fitting(start, quantum, fits) == expected
    assert len(probed) == len(set(probed))  # no compile twice
