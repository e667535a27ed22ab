"""Stage preference_data: preference pairs for train_dpo, checked, in data/preference/.

    python -m stages.preference_data

With `preference.enabled`, reads the pairs of `preference.data` (local <local_dir>/<split>.jsonl,
or a Hub dataset at a pinned commit, e.g. HuggingFaceH4/ultrafeedback_binarized), checks
every row (stages/lib/preference_pairs.py: the chat data's policy, `on_bad_row` and
`max_skipped_fraction`), renders each pair as the two texts train_dpo reads (the base
model's chat template) and writes
  data/preference/train.jsonl, eval.jsonl   {"chosen": text, "rejected": text}
  data/preference/skipped.jsonl             every pair left out: split, row number, why
  metrics/preference_data.json              pairs per split, skipped, and how many MaxText will
                                            cut (a prompt over preference.max_prompt_length
                                            tokens loses its start, an answer over the rest
                                            its end)
Off, it writes a note in data/preference/ (always the same bytes) and reads nothing.
"""

import json
import os

from stages.lib import chat, decontamination, hardware, hub, outputs, package_data, paths, preference_pairs
from stages.lib.cli import run
from stages.lib.params import load

OUT = paths.PREFERENCE_DATA
SKIPPED = "skipped.jsonl"
METRICS = os.path.join("metrics", "preference_data.json")
OFF_TEXT = (
    "Preference tuning is off (`preference.enabled: false`): no pairs, and the pipeline's result is the SFT\n"
    "model. Turn it on with `dvc exp run -S preference.enabled=true` (docs/preference.md).\n"
)


def select(d: dict, split: str, exclude=None) -> tuple[str, object, chat.Selection]:
    """(where, rows, selection) of one split: the one place `preference.data.*` becomes a row
    check (this stage and tools/validate.py both read pairs through it). `exclude`: the
    training split's decontamination filter."""
    where, rows = chat.split_rows(d, split, "preference.data")
    selection = chat.Selection(
        where,
        None,
        d["on_bad_row"],
        d["max_skipped_fraction"],
        parse=preference_pairs.parser(d["format"]),
        section="preference.data",
        exclude=exclude,
    )
    return where, rows, selection


def cut_by_maxtext(pairs: list[dict], tokenizer, pref: dict) -> int:
    """Pairs whose prompt or an answer MaxText will cut to fit (DPODataFormatting)."""
    if not pairs:
        return 0
    max_answer = pref["max_target_length"] - pref["max_prompt_length"]
    chosen = tokenizer([p["chosen"] for p in pairs])["input_ids"]
    rejected = tokenizer([p["rejected"] for p in pairs])["input_ids"]
    cut = 0
    for c, r in zip(chosen, rejected, strict=True):
        prompt, a, b = preference_pairs.split_lengths(c, r)
        cut += prompt > pref["max_prompt_length"] or max(a, b) > max_answer
    return cut


def write_split(pairs, tokenizer, pref: dict, out_path: str, chunk: int = 1000) -> int:
    """Writes the rendered pairs, a chunk at a time (memory stays flat); returns how many
    MaxText will cut."""
    cut, batch = 0, []
    with open(out_path, "w", encoding="utf-8") as f:
        for pair in pairs:
            batch.append(preference_pairs.render(pair, tokenizer))
            if len(batch) == chunk:
                cut += cut_by_maxtext(batch, tokenizer, pref)
                f.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in batch)
                batch = []
        cut += cut_by_maxtext(batch, tokenizer, pref)
        f.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in batch)
    return cut


def tokenizer_as_maxtext(model_dir: str = paths.BASE_HF):
    """The base's tokenizer, adding BOS and EOS as MaxText's DPO pipeline has it do."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(
        model_dir, add_bos_token=True, add_eos_token=True, legacy=False, extra_special_tokens={}
    )


def main() -> None:
    params = load()
    pref = params.preference
    if not pref["enabled"]:
        with outputs.staged_dir(OUT) as tmp:
            outputs.write_text(os.path.join(tmp, paths.OFF_NOTE), OFF_TEXT)
        outputs.write_json(METRICS, {"preference_data": {"enabled": False}})
        print("preference_data: preference.enabled is false; nothing to read", flush=True)
        return
    hardware.check_present(params)
    d = pref["data"]
    if d["source"] == "hub":
        hub.check_access(d["repo_id"], d["revision"], "dataset")
    if d["source"] == "package":  # before anything is written
        package_data.locate(d["package"], "preference.data.package")
    decontaminate = decontamination.Filter(d["decontaminate"], "preference.data")
    tokenizer = tokenizer_as_maxtext()
    counts = {"enabled": True}
    with outputs.staged_dir(OUT) as tmp:
        skipped = []
        for name, split, limit in chat.splits(d):
            where, rows, selection = select(d, split, decontaminate if name == "train" else None)
            cut = write_split(selection.rows(rows, limit), tokenizer, pref, os.path.join(tmp, f"{name}.jsonl"))
            skipped += [{"split": name, **s} for s in selection.skipped + selection.excluded]
            counts[name] = {"pairs": selection.kept, "skipped": len(selection.skipped), "cut_to_fit": cut}
            if name == "train":
                counts[name]["decontaminated"] = len(selection.excluded)
            print(
                f"preference_data: {name}: {selection.kept} pairs from {where}"
                + (f", {len(selection.skipped)} bad pairs skipped ({OUT}/{SKIPPED})" if selection.skipped else "")
                + (
                    f", {len(selection.excluded)} left out for holding a benchmark's prompt ({OUT}/{SKIPPED})"
                    if selection.excluded
                    else ""
                )
                + (
                    f"; {cut} longer than preference.max_prompt_length / max_target_length, which MaxText cuts"
                    if cut
                    else ""
                ),
                flush=True,
            )
        with open(os.path.join(tmp, SKIPPED), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in skipped)
    outputs.write_json(METRICS, {"preference_data": counts})


if __name__ == "__main__":
    run(main, "preference_data")
