"""dvc push / dvc pull of a sharded 2 GB export vs raw gcsfs put / get of the same files.

    python -m bench.remote_transfer                 # 2 GB, 3 rounds (~10 minutes)
    python -m bench.remote_transfer --size-gb 0.5 --rounds 1

Both sides talk the real GCS protocol to fake-gcs-server on 127.0.0.1 (the emulator the tests
use), each as its own process, with the project's remote settings (.dvc/config: jobs, verify).
Rounds alternate which side goes first; the emulator is restarted empty before every round
(it keeps uploads in RAM). Prints medians and the DVC / raw ratio per direction.
"""

import argparse
import configparser
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, Row, log, table, verdict  # noqa: E402
from testkit.gcs_server import CLIENT_ENV, GcsServer  # noqa: E402

BUCKET = "bench-bucket"
RAW = """
import sys, gcsfs
fs = gcsfs.GCSFileSystem(endpoint_url=sys.argv[1], token="anon")
if sys.argv[2] == "put":
    fs.put(sys.argv[3], sys.argv[4], recursive=True)
else:
    fs.get(sys.argv[3], sys.argv[4], recursive=True)
"""


def run(cmd, cwd) -> float:
    env = {**os.environ, **CLIENT_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def make_export(path: Path, size_gb: float) -> None:
    """Like convert_out's output: a few large safetensors shards and small side files."""
    path.mkdir(parents=True)
    shards = 4
    for i in range(1, shards + 1):
        with open(path / f"model-{i:05d}-of-{shards:05d}.safetensors", "wb") as f:
            remaining = int(size_gb * 1e9 / shards)
            while remaining > 0:
                f.write(os.urandom(min(remaining, 64 << 20)))
                remaining -= 64 << 20
    for name, size in (
        ("config.json", 2_000),
        ("tokenizer.json", 33_000_000),
        ("tokenizer_config.json", 130_000),
        ("model.safetensors.index.json", 40_000),
        ("generation_config.json", 200),
    ):
        (path / name).write_bytes(os.urandom(size))


def project_remote_settings() -> dict:
    config = configparser.ConfigParser()
    config.read(ROOT / ".dvc" / "config")
    section = config["'remote \"gcs\"'"]
    return {k: section[k] for k in ("jobs", "verify") if k in section}


def bench(work: Path, size_gb: float = 2.0, rounds: int = 3, overrides: dict | None = None) -> list[Row]:
    repo = work / "repo"
    repo.mkdir()
    dvc = [str(Path(sys.executable).parent / "dvc")]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(dvc + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(dvc + ["config", "cache.type", "hardlink,symlink"], cwd=repo, check=True)
    make_export(repo / "export", size_gb)
    subprocess.run(dvc + ["add", "-q", "export"], cwd=repo, check=True)  # hashing happens once, untimed
    settings = {**project_remote_settings(), **(overrides or {})}
    times = {"dvc push": [], "gcsfs put": [], "dvc pull": [], "gcsfs get": []}

    for i in range(rounds):
        server = GcsServer(work / f"gcs-{i}")
        server.start()
        server.create_bucket(BUCKET)
        subprocess.run(
            dvc + ["remote", "add", "-f", "-d", "bench", f"gs://{BUCKET}/dvc"],
            cwd=repo,
            check=True,
            capture_output=True,
        )
        for key, value in {"endpointurl": server.url, "allow_anonymous_login": "true", **settings}.items():
            subprocess.run(dvc + ["remote", "modify", "bench", key, value], cwd=repo, check=True)
        clone = work / f"clone-{i}"
        shutil.copytree(repo, clone, ignore=shutil.ignore_patterns("cache", "export"))
        raw_dest = work / f"raw-{i}"
        # Each step is called in this iteration, with this round's server, clone and destination.
        steps = [
            ("dvc push", lambda: run(dvc + ["push", "-q"], repo)),
            (
                "gcsfs put",
                lambda: run(
                    [sys.executable, "-c", RAW, server.url, "put", str(repo / "export"), f"{BUCKET}/raw/export"], repo
                ),
            ),
            ("dvc pull", lambda: run(dvc + ["pull", "-q"], clone)),
            (
                "gcsfs get",
                lambda: run(
                    [sys.executable, "-c", RAW, server.url, "get", f"{BUCKET}/raw/export", str(raw_dest)], work
                ),
            ),
        ]
        pairs = [steps[:2], steps[2:]]
        for pair in pairs:
            for name, step in pair if i % 2 == 0 else pair[::-1]:
                times[name].append(step())
        server.stop()
        shutil.rmtree(work / f"gcs-{i}")
        shutil.rmtree(clone)
        shutil.rmtree(raw_dest)
        log(f"remote: round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()))

    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for a, b in (("dvc push", "gcsfs put"), ("dvc pull", "gcsfs get")):
        ratio = med[a] / med[b]
        rows.append(
            Row(
                f"8. remote: `{a}` vs raw gcsfs, {size_gb:g} GB export",
                f"{med[a]:.1f} s",
                f"{med[b]:.1f} s",
                f"{ratio:.2f}x",
                "<= 1.25x",
                verdict(ratio <= 1.25),
                [f"fake-gcs-server on 127.0.0.1, {rounds} rounds alternating, remote settings {settings}"],
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a remote setting from .dvc/config (e.g. verify=false, jobs=4) to see what it costs",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-remote-", dir=os.environ.get("BENCH_TMP")) as work:
        print(table(bench(Path(work), args.size_gb, args.rounds, dict(kv.split("=", 1) for kv in args.set))))


if __name__ == "__main__":
    main()
