"""Packing efficiency: the fraction of non-padding tokens in MaxText's packed training batches.

    python bench/packing.py    # ~2 minutes

Counts what the trainer receives, from MaxText's own SFT input pipeline (tokenizer, chat
template, grain's PackAndBatch) as the train stage configures it (stages/lib/data_position.py
builds the iterator), at the 4B recipe's max_target_length (2048) with a v6e-8 host's batch of
8 rows (8 simulated devices x per-device batch 1). Data: the tiny recipe's chat set (also at
its own recipe's 256 on one CPU device), and a synthetic set with UltraChat 200k's shape
(see ultrachat_like). The last batch of each run
is left out: it is partly empty because the data ended, not because of packing.

    python bench/packing.py --worker -- <MaxText SFT flags>   # one measurement
"""

import json
import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, log, new_workspace, run_alone, timed, verdict  # noqa: E402

RECIPE_MAX_LENGTH = 2048  # recipes/gemma3-4b-v6e-8.yaml train.max_target_length
HOST_DEVICES = 8  # a v6e-8 VM: one host, 8 chips
WORDS = ("the model data train token answer question people water history system language light number city "
         "world time river music energy school market plant health computer science story value power game "
         "because however between through during without against another example important different").split()


def ultrachat_like(n: int, seed: int = 0) -> list[dict]:
    """Conversations shaped like UltraChat 200k's train_sft: 1-6 user/assistant exchanges
    (mean ~3), a templated length drawn log-normally (median ~1,100 Gemma tokens, long tail,
    a few over 2,048), assistants writing ~85% of it. Words are ~1 token each; the measured
    lengths are printed. (No network here to read the real set; this is its published
    shape, approximated.)"""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        exchanges = min(6, 1 + int(rng.expovariate(1 / 2.0)))
        words = max(40, int(rng.lognormvariate(7.0, 0.6)))  # e^7 ~ 1,100
        per_exchange = max(8, words // exchanges)
        messages = []
        for _ in range(exchanges):
            user = max(4, int(per_exchange * 0.15))
            messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=user))})
            messages.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=per_exchange - user))})
        rows.append({"messages": messages})
    return rows


def worker(maxtext_args: list[str]) -> None:
    from absl import flags

    from stages.lib.data_position import packed_batches

    flags.FLAGS(sys.argv[:1])  # grain's workers read absl flags
    config, segmentations = packed_batches(maxtext_args)
    batches = []
    for segments in segmentations:
        batches.append((int((segments > 0).sum()), segments.size, int(segments.max(axis=1).sum())))
    full = batches[:-1]
    print("PACKING " + json.dumps({"real": sum(b[0] for b in full), "slots": sum(b[1] for b in full),
                                   "batches": len(full), "rows": segments.shape[0], "conversations": sum(b[2] for b in full)}))


def measure(root: Path, data: Path, max_length: int, devices: int, per_device_batch: int = 1) -> dict:
    """Runs the worker with the train stage's flags for this data at this length."""
    here = os.getcwd()
    os.chdir(root)
    try:
        from stages import train
        from stages.lib import maxtext
        from stages.lib.params import load

        params = load()
        params["train"].update(max_target_length=max_length, per_device_batch_size=per_device_batch, num_epochs=1)
        work = SimpleNamespace(url=str(root / "packing"), local=str(root / "packing"), metrics_file="/dev/null")
        args = train.maxtext_args(params, work, str(data))
        env = {**maxtext.child_env(params), "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    finally:
        os.chdir(here)
    run = timed([sys.executable, __file__, "--worker", "--", *args], root, extra_env=env)
    return json.loads(run.output.rsplit("PACKING ", 1)[1].splitlines()[0])


def templated_lengths(base_hf: Path, rows: list[dict]) -> list[int]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(base_hf)
    return [len(x) for x in tokenizer.apply_chat_template([r["messages"] for r in rows], tokenize=True,
                                                           return_dict=True)["input_ids"]]


def bench(work: Path) -> list[Row]:
    root = new_workspace(work / "packing")
    timed(["dvc", "repro", "-q", "dataset", "base_model"], root)
    # The tiny set is 320 short conversations: a handful of 8 x 2048 batches. Repeated in
    # shuffled epochs, as the train stage's stream does, so the last batch weighs little.
    tiny_rows = (root / "data" / "chat" / "train.jsonl").read_text().splitlines(keepends=True)
    tiny = work / "tiny-x10.jsonl"
    tiny.write_text("".join(tiny_rows[i] for epoch in range(10) for i in random.Random(epoch).sample(range(len(tiny_rows)), len(tiny_rows))))
    synthetic_rows = ultrachat_like(800)
    synthetic = work / "ultrachat-like.jsonl"
    synthetic.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows))
    lengths = sorted(templated_lengths(root / "models" / "base-hf", synthetic_rows))
    shape = (f"synthetic: {len(lengths)} conversations, templated length median {lengths[len(lengths) // 2]}, "
             f"mean {sum(lengths) / len(lengths):.0f}, {sum(n > RECIPE_MAX_LENGTH for n in lengths) / len(lengths):.0%} "
             f"over {RECIPE_MAX_LENGTH} (truncated)")
    rows = []
    for name, data, length, devices, per_device in (
        ("tiny chat set x10", tiny, RECIPE_MAX_LENGTH, HOST_DEVICES, 1),
        ("tiny chat set x10, tiny recipe on CPU", tiny, 256, 1, 1),
        ("UltraChat-like", synthetic, RECIPE_MAX_LENGTH, HOST_DEVICES, 1),
        # Grain packs first-fit within one batch: more rows per batch, fewer stranded gaps.
        ("UltraChat-like, per-device batch 2", synthetic, RECIPE_MAX_LENGTH, HOST_DEVICES, 2),
    ):
        log(f"packing: {name} at {length}")
        m = measure(root, data, length, devices, per_device)
        fraction = m["real"] / m["slots"]
        notes = [f"{m['conversations']} conversations in {m['batches']} batches of {m['rows']} x {length}"]
        rows.append(Row(f"6. packing: {name}, max length {length}", f"{m['real']:,} tokens", f"{m['slots']:,} slots",
                        f"{fraction:.3f}", ">= 0.9", verdict(fraction >= 0.9, f"{fraction:.3f}"),
                        notes + ([shape] if data == synthetic else [])))
    return rows


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--") + 1:])
    else:
        run_alone("packing", bench)
