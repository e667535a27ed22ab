"""Training through a bucket that misbehaves as GCS does under load, against the same bucket
behaving: the tiny recipe's train stage with its working directory (checkpoints: tensorstore
and gcsfs) and JAX's compilation cache on gs://, fake-gcs-server reached directly or through
testkit/flaky_proxy.py answering 20% of requests 429/503 and dropping 10% of connections
(half before the answer, half halfway through it, after the work was done).

    python -m bench.flaky_bucket    # ~10 minutes

In one fresh project copy (inputs built untimed), the train stage runs twice from an empty
working directory and an empty cache, each in a bucket of its own: clean, then flaky. Both
must end with the same parameters, bit for bit (the suite holds a one-process run through a
flaky bucket, at a smaller share, against a clean two-process one: tests/test_multihost.py).
"""

import shutil
import sys
from pathlib import Path

import numpy as np

from bench.common import Row, log, new_workspace, run_alone, timed  # noqa: E402

FAIL_SHARE, RESET_SHARE = 0.2, 0.1


def params_of(root: Path) -> dict:
    from testkit.workspace import flat_params

    return flat_params(root / "models" / "sft-maxtext" / "params")


def bench(work: Path) -> list[Row]:
    from testkit.flaky_proxy import FlakyProxy
    from testkit.gcs_server import client_env, running
    from testkit.workspace import set_param

    root = new_workspace(work / "flaky-bucket")
    timed(["dvc", "repro", "-q", "convert_in", "token_lengths"], root)
    set_param(root, "runtime.profile_steps", 0)  # (JAX's profiler has a GCS client of its own, not the emulator's)
    found, weights = {}, {}
    with running(work / "flaky-bucket-gcs", "clean", "flaky") as server:
        for bucket in ("clean", "flaky"):
            set_param(root, "runtime.scratch_dir", f"gs://{bucket}/scratch")
            set_param(root, "runtime.compile_cache_dir", f"gs://{bucket}/jax-cache")
            shutil.rmtree(root / ".scratch", ignore_errors=True)
            shares = (
                (FAIL_SHARE, RESET_SHARE) if bucket == "flaky" else (0.0, 0.0)
            )  # (clean: the same proxy, passing all)
            with FlakyProxy(server.url, fail_share=shares[0], reset_share=shares[1]) as proxy:
                log(f"flaky_bucket: train, {bucket} bucket")
                run = timed([sys.executable, "-m", "stages.train"], root, extra_env=client_env(proxy))
                found[bucket] = {"wall": run.seconds, "faults": dict(proxy.injected), "passed": proxy.passed}
            weights[bucket] = params_of(root)
    same = weights["clean"].keys() == weights["flaky"].keys() and all(
        np.array_equal(weights["clean"][k], weights["flaky"][k]) for k in weights["clean"]
    )
    flaky, clean = found["flaky"], found["clean"]
    faults = sum(flaky["faults"].values())
    return [
        Row(
            "22. a flaky bucket: train stage wall, 20% 429/503 + 10% dropped vs clean (tiny, gs:// scratch and cache)",
            f"{flaky['wall']:.1f} s",
            f"{clean['wall']:.1f} s",
            f"{flaky['wall'] / clean['wall']:.2f}x",
            "completes, same weights",
            "met" if same else "MISSED: the weights differ",
            [
                f"flaky: {faults} faults injected of {faults + flaky['passed']} requests: {flaky['faults']}",
                f"clean: {clean['passed']} requests",
                f"parameters bit-identical: {same}",
            ],
        )
    ]


if __name__ == "__main__":
    run_alone("flaky_bucket", bench)
