"""Nothing changed: `dvc status` and `dvc repro` with Gemma-3-4B-sized outputs in place vs an empty pipeline.

    python -m bench.no_change --reps 3    # ~3 minutes, ~17 GB of free disk

Two copies of the project on the 4B recipe, every stage recorded in dvc.lock with `dvc commit`
(no stage runs). In "4B", the outputs have the real sizes: the HF export as ~9 shards of
1 GB (8.6 GB) and the trained MaxText checkpoint as Orbax OCDBT data files (8 GB); in
"empty", every output is a few bytes. Both are timed alternately; before each 4B run the
big files are dropped from the page cache, so reading them would cost real disk time.

No re-hashing is proven, not inferred: each `dvc` runs in a Python that reports the bytes
its process read (/proc/self/io `rchar`, all threads) when it exits. Hashing 16.6 GB reads
16.6 GB; looking the files up in DVC's state database (inode, size, mtime) reads none of them.
A control shows the measure works: after `touch`ing the outputs, `dvc status` re-hashes them.
"""

import os
import sys
from pathlib import Path

import yaml

from bench.common import GB, Row, evict, log, median, new_workspace, run_alone, timed, verdict  # noqa: E402

HF_EXPORT_BYTES = int(8.6e9)
CHECKPOINT_BYTES = int(8.0e9)
SMALL_FILES = {".json": '{"value": 1.0}\n', ".csv": "step,value\n1,1.0\n", ".md": "text\n"}
# `python -c DVC_READS <dvc args>`: runs dvc and, as it exits, prints what the process read.
DVC_READS = """
import atexit, sys
def report():
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    print(f"\\nBYTES_READ {io['rchar']}", file=sys.stderr, flush=True)
atexit.register(report)
from dvc.cli import main
sys.exit(main(sys.argv[1:]))
"""


def filler(tag: str, size: int, block: bytes):
    """size bytes, distinct per tag (so the cache cannot deduplicate files), quickly."""
    head = tag.encode().ljust(4096, b"\0")
    yield head
    left = size - len(head)
    while left > 0:
        yield block[: min(left, len(block))]
        left -= len(block)


def write(path: Path, tag: str, size: int, block: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for chunk in filler(tag, size, block):
            f.write(chunk)


def fill_outputs(root: Path, big: bool) -> None:
    """Every output dvc.yaml declares, at the real 4B sizes (big) or a few bytes."""
    block = os.urandom(64 << 20)
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        for entry in stage.get("outs", []) + stage.get("metrics", []):
            out = root / (entry if isinstance(entry, str) else next(iter(entry)))
            if out.suffix:  # metrics, plots, the generations file: DVC parses them
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(SMALL_FILES[out.suffix])
            elif big and out.name == "sft-hf":
                shards = 9
                for i in range(1, shards + 1):
                    write(
                        out / f"model-{i:05d}-of-{shards:05d}.safetensors",
                        f"{out}:{i}",
                        HF_EXPORT_BYTES // shards,
                        block,
                    )
                for side in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
                    write(out / side, f"{out}:{side}", 50_000, block)
            elif big and out.name == "sft-maxtext":
                data = out / "params" / "ocdbt.process_0" / "d"
                files = 8
                for i in range(files):
                    write(data / f"{i:032x}", f"{out}:{i}", CHECKPOINT_BYTES // files, block)
                for side in ("_sharding", "commit_success.txt", "ocdbt.process_0/manifest.ocdbt", "_METADATA"):
                    write(out / "params" / side, f"{out}:{side}", 4_000, block)
            else:
                write(out / "config.json", f"{name}:{out}", 64, block)  # base-hf/config.json is a dependency


def pipeline(root: Path, big: bool) -> Path:
    new_workspace(root, recipe="gemma3-4b-v6e-8")
    fill_outputs(root, big)
    timed(["dvc", "commit", "-f", "-q"], root)  # hashes everything once, records every stage
    for _ in range(2):  # as after any earlier command: DVC's own caches are warm
        dvc(root, "status")
    return root


def dvc(root: Path, *args: str) -> tuple[float, int, str]:
    """(seconds, bytes the dvc process read, output)."""
    run = timed([sys.executable, "-c", DVC_READS, *args], root)
    read = int(run.output.rsplit("BYTES_READ ", 1)[1].split()[0])
    return run.seconds, read, run.output


def bench(work: Path, reps: int = 3) -> list[Row]:
    log("no-change: writing 16.6 GB of 4B-sized outputs and committing them (untimed)")
    big, empty = pipeline(work / "4b", big=True), pipeline(work / "empty", big=False)
    results = {(name, cmd): [] for name in ("4b", "empty") for cmd in ("status", "repro")}
    for i in range(reps):
        for name, root in (("4b", big), ("empty", empty)) if i % 2 == 0 else (("empty", empty), ("4b", big)):
            for cmd in ("status", "repro"):
                if name == "4b":
                    evict(root / "models")
                seconds, read, output = dvc(root, cmd)
                assert "changed" not in output and "Running stage" not in output, output
                results[(name, cmd)].append((seconds, read))
    # The control: the same files with a new mtime must be hashed again, and that must show.
    for path in (big / "models").rglob("*"):
        if path.is_file():
            os.utime(path)
    evict(big / "models")
    control_s, control_read, _ = dvc(big, "status")
    rows = []
    for cmd in ("status", "repro"):
        t4b, tempty = (median([s for s, _ in results[(n, cmd)]]) for n in ("4b", "empty"))
        read4b, read_empty = (max(r for _, r in results[(n, cmd)]) for n in ("4b", "empty"))
        ok = t4b < 2.0 and read4b < 0.01 * (HF_EXPORT_BYTES + CHECKPOINT_BYTES)
        rows.append(
            Row(
                f"2. nothing changed: `dvc {cmd}`, 4B-sized outputs vs empty pipeline",
                f"{t4b:.2f} s",
                f"{tempty:.2f} s",
                f"{t4b / tempty:.2f}x",
                "< 2 s, no re-hashing",
                verdict(ok, f"{t4b:.2f} s" if t4b >= 2.0 else f"read {read4b / GB:.1f} GB"),
                [
                    f"the dvc process read {read4b / 1e6:.0f} MB with 16.6 GB of outputs in place, "
                    f"{read_empty / 1e6:.0f} MB "
                    f"with empty ones: nothing was re-hashed (control: after `touch` of the outputs, `dvc status` read "
                    f"{control_read / GB:.1f} GB in {control_s:.1f} s); {reps} reps, alternating"
                ],
            )
        )
    return rows


if __name__ == "__main__":
    run_alone("no-change", bench, reps=3)
