"""`dvc plots show` writes an HTML page that renders the training curves in a real browser
(Debian's Chromium, headless, driven by tests/browser/render.mjs)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.workspace import sh

BROWSER_DIR = Path(__file__).parent / "browser"
pytestmark = pytest.mark.slow


def test_plots_page_renders_the_loss_curve(tiny_run, tmp_path):
    if not (BROWSER_DIR / "node_modules").is_dir() or not shutil.which("chromium"):
        pytest.fail(
            "the browser check needs Chromium and tests/browser/node_modules: run scripts/test.sh (it installs them)"
        )
    out = tmp_path / "plots"
    sh(["dvc", "plots", "show", "-o", str(out)], tiny_run.path)
    page = out / "index.html"
    screenshot = tmp_path / "plots.png"
    proc = subprocess.run(
        ["node", str(BROWSER_DIR / "render.mjs"), str(page), str(screenshot)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == []
    assert report["declared"] == report["rendered"] == 3, report  # loss, learning rate, throughput
    assert all(ink > 0.02 for ink in report["inked"]), report  # axes, curves and labels drawn
    assert "Loss (train per step, held-out every" in page.read_text()  # dvc.yaml's loss plot, first
    assert screenshot.stat().st_size > 20_000
    shutil.copy(screenshot, Path(tiny_run.path) / "logs" / "plots.png")  # to look at
