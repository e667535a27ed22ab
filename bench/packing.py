"""Packing efficiency: the fraction of non-padding tokens in MaxText's packed training batches,
for the stream shuffled only and as the train stage arranges it for the packer (stages/lib/stream.py).

    python -m bench.packing    # ~5 minutes

Counts what the trainer receives, from MaxText's own SFT input pipeline (tokenizer, chat
template, grain's PackAndBatch) as the train stage configures it (stages/in_maxtext/data_position.py
builds the iterator), at the 4B recipe's max_target_length (2048) with a v6e-8 host's batch of
8 rows (8 simulated devices x per-device batch 1). Data: the tiny recipe's chat set (also at
its own recipe's 256 on one CPU device), and a synthetic set with UltraChat 200k's shape
(see ultrachat_like). The last batch of each run
is left out: it is partly empty because the data ended, not because of packing.

    python -m bench.packing --worker -- <MaxText SFT flags>   # one measurement
"""

import json
import os
import random
import sys
from pathlib import Path

from bench.common import Row, log, new_workspace, run_alone, timed, verdict  # noqa: E402
from bench.synthetic import ultrachat_like  # noqa: E402

RECIPE_MAX_LENGTH = 2048  # recipes/gemma3-4b-v6e-8.yaml train.max_target_length
HOST_DEVICES = 8  # a v6e-8 VM: one host, 8 chips


def worker(maxtext_args: list[str]) -> None:
    from absl import flags

    from stages.in_maxtext.data_position import packed_batches

    flags.FLAGS(sys.argv[:1])  # grain's workers read absl flags
    config, segmentations = packed_batches(maxtext_args)
    batches = []
    for segments in segmentations:
        batches.append((int((segments > 0).sum()), segments.size, int(segments.max(axis=1).sum())))
    full = batches[:-1]
    print(
        "PACKING "
        + json.dumps(
            {
                "real": sum(b[0] for b in full),
                "slots": sum(b[1] for b in full),
                "batches": len(full),
                "rows": segments.shape[0],
                "conversations": sum(b[2] for b in full),
            }
        )
    )


def measure(root: Path, data: Path, max_length: int, devices: int, per_device_batch: int = 1) -> dict:
    """Runs the worker with the train stage's flags for this data at this length."""
    here = os.getcwd()
    os.chdir(root)
    try:
        from stages.lib import flags, maxtext_process
        from stages.lib.params import load

        params = load()
        params["train"].update(max_target_length=max_length, per_device_batch_size=per_device_batch, num_epochs=1)
        args = flags.train(params, str(root / "packing"), "/dev/null", str(data)).args
        env = {**maxtext_process.child_env(params), "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    finally:
        os.chdir(here)
    run = timed([sys.executable, "-m", "bench.packing", "--worker", "--", *args], root, extra_env=env)
    return json.loads(run.output.rsplit("PACKING ", 1)[1].splitlines()[0])


def token_lengths(base_hf: Path, data: Path):
    """Tokens per row as MaxText counts them (what the token_lengths stage writes)."""
    from stages.in_maxtext import count_tokens as tl

    return tl.count(tl.load_tokenizer(str(base_hf)), str(data), "whole")["tokens"]


def arrange(data: Path, lengths, out: Path, batch_rows: int, max_length: int, window: int) -> int:
    """`data` in the train stage's arranged order (one epoch, seed 0); returns how far the
    farthest row moved from its shuffled place."""
    import numpy as np

    from stages.lib import stream

    packing = stream.Packing(lengths, batch_rows, max_length, window)
    stream.write(str(data), str(out), 0, 1, packing)
    shuffled = next(stream.epoch_orders(len(lengths), 0, 1))
    got = list(stream.packed_order([shuffled], packing))
    return int(np.abs(np.argsort(got) - np.argsort(shuffled)).max())


def shuffle(data: Path, out: Path) -> None:
    from stages.lib import stream

    stream.write(str(data), str(out), 0, 1)


def bench(work: Path) -> list[Row]:
    from stages.lib.params import load

    root = new_workspace(work / "packing")
    timed(["dvc", "repro", "-q", "dataset", "base_model"], root)
    here = os.getcwd()
    os.chdir(root)
    try:
        window = load()["train"]["pack_window"]  # the recipes' value
    finally:
        os.chdir(here)
    # The tiny set is 320 short conversations: a handful of 8 x 2048 batches. Repeated in
    # shuffled epochs, as the train stage's stream does, so the last batch weighs little.
    tiny_rows = (root / "data" / "chat" / "train.jsonl").read_text().splitlines(keepends=True)
    tiny = work / "tiny-x10.jsonl"
    tiny.write_text(
        "".join(
            tiny_rows[i]
            for epoch in range(10)
            for i in random.Random(epoch).sample(range(len(tiny_rows)), len(tiny_rows))
        )
    )
    synthetic = work / "ultrachat-like.jsonl"
    synthetic.write_text("".join(json.dumps(r) + "\n" for r in ultrachat_like(2000)))
    lengths = {data: token_lengths(root / "models" / "base-hf", data) for data in (tiny, synthetic)}
    sl = sorted(lengths[synthetic])
    shape = (
        f"synthetic: {len(sl)} conversations, length median {sl[len(sl) // 2]}, mean {sum(sl) / len(sl):.0f}, "
        f"{sum(n > RECIPE_MAX_LENGTH for n in sl) / len(sl):.0%} over {RECIPE_MAX_LENGTH} (cut to it)"
    )
    rows = []
    for name, data, length, devices, per_device in (
        ("tiny chat set x10", tiny, RECIPE_MAX_LENGTH, HOST_DEVICES, 1),
        ("tiny chat set x10, tiny recipe on CPU", tiny, 256, 1, 1),
        ("UltraChat-like", synthetic, RECIPE_MAX_LENGTH, HOST_DEVICES, 1),
        ("UltraChat-like, per-device batch 2", synthetic, RECIPE_MAX_LENGTH, HOST_DEVICES, 2),
    ):
        shuffled, ordered = work / "shuffled.jsonl", work / "arranged.jsonl"
        shuffle(data, shuffled)
        moved = arrange(data, lengths[data], ordered, devices * per_device, length, window)
        found = {}
        for how, stream_file in (("shuffled", shuffled), (f"arranged, window {window}", ordered)):
            log(f"packing: {name} at {length}, {how}")
            found[how] = measure(root, stream_file, length, devices, per_device)
        (before, m_before), (label, m) = found.items()
        fraction, was = m["real"] / m["slots"], m_before["real"] / m_before["slots"]
        notes = [
            f"{m['conversations']} conversations in {m['batches']} batches of {m['rows']} x {length}; "
            f"shuffled: {m_before['conversations']} in {m_before['batches']} batches; "
            f"the farthest row moved {moved} places from its shuffled position"
        ]
        rows.append(
            Row(
                f"6. packing: {name}, max length {length}",
                f"{fraction:.3f} ({label})",
                f"{was:.3f} (shuffled)",
                f"{fraction / was:.3f}x",
                ">= 0.92",
                verdict(fraction >= 0.92, f"{fraction:.3f}"),
                notes + ([shape] if data == synthetic else []),
            )
        )
    return rows


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--") + 1 :])
    else:
        run_alone("packing", bench)
