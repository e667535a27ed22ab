"""How soon bad input stops the pipeline, against how long MaxText takes just to start.

    python -m bench.fail_fast          # ~1 minute; bench/run.py runs it with the rest

Each case is the real stage (or `dvc repro`) in a fresh copy of the project, broken the way
tests/test_bad_input.py and tests/test_tpu_recipe.py break it; the tests check that each
stops with one line before MaxText starts, this times it. The baseline is what the user
would otherwise have waited for before MaxText's own error: the import of MaxText's SFT
trainer (`python -c "import maxtext.trainers.post_train.sft.train_sft"`), measured alongside.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Row, env, log, median, new_workspace, run_alone, verdict  # noqa: E402

TARGET_S = 5.0


def seconds(cmd: list[str], cwd: Path, **extra) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env(**extra), capture_output=True)
    return time.perf_counter() - started


def cases(work: Path) -> dict[str, tuple[Path, list[str], dict]]:
    bad_key = new_workspace(work / "bad-key")
    text = (bad_key / "params.yaml").read_text().replace("  steps: 40", "  setps: 40")
    (bad_key / "params.yaml").write_text(text)
    bad_row = new_workspace(work / "bad-row")
    rows = (bad_row / "assets" / "tiny-chat" / "train.jsonl").read_text().splitlines()
    rows[100] = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    (bad_row / "assets" / "tiny-chat" / "train.jsonl").write_text("\n".join(rows) + "\n")
    tpu = new_workspace(work / "tpu-on-cpu", recipe="gemma3-4b-v6e-8")
    return {
        "a params.yaml typo (python -m stages.base_model)": (bad_key, [sys.executable, "-m", "stages.base_model"], {}),
        "a bad chat row at row 101 (python -m stages.dataset)": (bad_row, [sys.executable, "-m", "stages.dataset"], {}),
        "the TPU recipe on a CPU machine (dvc repro)": (tpu, ["dvc", "repro"], {"HF_ENDPOINT": "http://127.0.0.1:9"}),
    }


def bench(work: Path, reps: int = 3) -> list[Row]:
    found = cases(work)
    maxtext_start = []
    times = {name: [] for name in found}
    for i in range(reps):  # alternating: the baseline first on odd rounds
        if i % 2 == 0:
            maxtext_start.append(
                seconds([sys.executable, "-c", "import maxtext.trainers.post_train.sft.train_sft"], work)
            )
        for name, (root, cmd, extra) in found.items():
            times[name].append(seconds(cmd, root, **extra))
        if i % 2 == 1:
            maxtext_start.append(
                seconds([sys.executable, "-c", "import maxtext.trainers.post_train.sft.train_sft"], work)
            )
    baseline = median(maxtext_start)
    log(f"fail_fast: MaxText's start {baseline:.1f} s")
    return [
        Row(
            f"9. fails fast: {name}",
            f"{median(t):.2f} s",
            f"{baseline:.1f} s (MaxText's start)",
            f"{median(t) / baseline:.3f}x",
            f"< {TARGET_S:.0f} s, one line",
            verdict(median(t) < TARGET_S),
            [f"{reps} reps, alternating with the baseline"],
        )
        for name, t in times.items()
    ]


if __name__ == "__main__":
    run_alone("fail_fast", bench, reps=3)
