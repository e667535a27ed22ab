"""Moves the train stage's run between a CPU machine and a TPU machine that has no network, in
pieces a transfer limit allows (this workplace's chip machine takes 64 MiB a call in, and gives
64 MiB back in files of at most 16 MiB). On a TPU VM that reaches a bucket the hand-off is DVC's
own (`dvc push` on one machine, `dvc pull` on the other: docs/tpu-vm.md); this stands in for
the bucket here, and moves the same files.

    python -m bench.chip_handoff inputs DIR     # here: train's inputs, as DVC checked them out
    python3 bench/chip_handoff.py unpack DIR    # there: every piece checked, then laid out
    python3 bench/chip_handoff.py outputs DIR   # there, after train: its outputs
    python -m bench.chip_handoff unpack DIR     # here again, then: dvc commit train && dvc repro

models/base-hf travels without its weights: train reads only its config, its tokenizer and
the safetensors headers (stages/shared/checkpoint.py's parameter_count), so the weights file
goes as its header alone. Everything else is byte for byte what DVC checked out. The pieces
are tools/tpu_bundle.py's: a manifest with each piece's size and SHA-256, checked before
anything is unpacked.
"""

import os
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import tpu_bundle  # noqa: E402  (run as a script there, before any .venv)

INPUTS = [
    "params.yaml",
    "models/base-maxtext",
    "models/base-hf",
    "data/chat",
    "data/constraints",
    "data/lengths",
    "metrics/fit_check.json",
]
WEIGHTS_LEFT_BEHIND = "models/base-hf"
OUTPUTS = ["models/sft-maxtext", "dvclive", "logs/train.log", "logs/train.cast.log"]
INPUT_PIECE = 60_000_000  # with the project's tracked files, under 64 MiB a call
OUTPUT_PIECE = 16_000_000  # what one file back from the chip machine may hold (16 MiB)


def header_only(path: str, dest: str) -> None:
    """A safetensors file's header alone (its 8-byte length, then the JSON)."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        f.seek(0)
        head = f.read(8 + length)
    with open(dest, "wb") as f:
        f.write(head)


def pack(paths: list[str], out: str, piece_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as work:
        archive = os.path.join(work, "handoff.tar.gz")
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
            for path in filter(os.path.exists, paths):
                if path != WEIGHTS_LEFT_BEHIND:
                    tar.add(path)
                    continue
                for name in sorted(os.listdir(path)):
                    full = os.path.join(path, name)
                    if name.endswith(".safetensors"):
                        header_only(full, os.path.join(work, name))
                        tar.add(os.path.join(work, name), full)
                    else:
                        tar.add(full)
        manifest = tpu_bundle.write_bundle(archive, out, piece_bytes, paths=paths)
    total = sum(p["bytes"] for p in manifest["pieces"])
    print(f"chip_handoff: {out}/: {len(manifest['pieces'])} pieces, {total / 1e6:.0f} MB", flush=True)


def unpack(bundle: str) -> None:
    manifest = tpu_bundle.read_manifest(bundle)
    tpu_bundle.check_pieces(bundle, manifest)
    tpu_bundle.extract(bundle, manifest, ".", "r|gz")
    print(f"chip_handoff: unpacked {bundle} ({len(manifest['pieces'])} pieces, every SHA-256 checked)", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("inputs", "outputs", "unpack"):
        print(__doc__, file=sys.stderr)
        return 2
    command, where = argv
    try:
        if command == "inputs":
            pack(INPUTS, where, INPUT_PIECE)
        elif command == "outputs":
            pack(OUTPUTS, where, OUTPUT_PIECE)
        else:
            unpack(where)
    except tpu_bundle.BundleError as e:
        print(f"chip_handoff: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
