"""Stage export_gguf: the tuned model as llama.cpp GGUF files, checked, with an Ollama Modelfile.

    python -m stages.export_gguf

Reads the checked HF export (models/sft-hf: the SFT or preference-tuned model, a LoRA run's
adapter merged) and writes, for each type of `gguf.types`, a GGUF of its language model
(stages/lib/gguf_export.py). Each file is then read back by an independent reader,
transformers' GGUF loader (its own metadata parsing, tensor-name map, dequantization and
undoing of llama.cpp's layouts), and checked against the HF export:
  - its tensors, put into the export's own architecture, give next-token distributions on the
    fixed chat prompts within `gguf.check.<type>` (KL, top-1 agreement: the logit gate's
    figures, limits per type from each type's measured floor);
  - the config transformers reads from its metadata agrees with the export's on every field
    both have (dimensions, heads, norm epsilon, RoPE base, sliding window, vocabulary, tying);
  - its tokenizer, built from the file's vocabulary, renders the chat template to the same
    ids as the export's tokenizer (checked on the first file: every file carries the same
    vocabulary, written by the same code).
A file that fails any of them fails the stage in one line and nothing is written: the files
are published together, in one rename, only once all passed. Writes
  models/gguf/                 model-<TYPE>.gguf per type, and Modelfile (Ollama: `ollama create`)
  metrics/gguf_check.json      under `gguf`, per type: bytes, seconds to write, KL, top-1 agreement
With `gguf.types: []` it writes models/gguf/README.md alone (a note, the same bytes every time).
"""

import os
import time

from stages.lib import gates, gguf_export, gguf_reading, hardware, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import checkpoint, families
from stages.shared.errors import StageFailed

OUT = paths.GGUF
METRICS = os.path.join("metrics", "gguf_check.json")
GROUP = "gguf"  # every metrics file's figures under one name: `dvc metrics show` labels them gguf.q8_0.kl_max
STEM = "model"
BYTES_PER_WEIGHT = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}  # q8_0: 32 int8 and one f16 scale a block
OFF = "No GGUF was asked for (gguf.types: []). Set gguf.types, e.g. [f16, q8_0], and run `dvc repro export_gguf`.\n"


def config_differences(read: dict, config) -> list[str]:
    """Where the config transformers reads from a GGUF's metadata differs from the export's
    (text) config, on the fields both have."""
    differences = []
    for key, value in sorted(read.items()):
        if key in ("architectures", "model_type", "_model_name_or_path") or key.endswith("_token_id"):
            continue  # names, and special tokens: the tokenizer check's
        if key == "rope_theta":
            rope = config.rope_parameters
            expected = (rope.get("full_attention") or rope)["rope_theta"]
        elif hasattr(config, key):
            expected = getattr(config, key)
        else:
            continue  # a field the export's config class does not have
        same = abs(value - expected) <= 1e-6 * abs(expected) if isinstance(expected, float) else value == expected
        if not same:
            differences.append(f"{key} {value!r} in the GGUF, {expected!r} in the export")
    return differences


def next_token_logits(model, prompts: list[list[int]]) -> list:
    """The model's float32 logits at every position of each prompt (the export's, or a GGUF's
    tensors loaded into it)."""
    import torch

    with torch.no_grad():
        return [model(input_ids=torch.tensor([p])).logits[0].float().numpy() for p in prompts]


def read_back(path: str, model, prompts: list[list[int]]) -> tuple[list, dict]:
    """The logits the GGUF's tensors give in the export's architecture (loaded into `model`
    in place), and the config transformers reads from its metadata."""
    import numpy as np
    import torch
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)
    ours = model.state_dict()
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = sorted(set(ours) - set(parsed["tensors"]) - ({"lm_head.weight"} if tied else set()))
    if missing:
        raise StageFailed(
            f"the GGUF check failed: {path} lacks {len(missing)} tensors of the model, e.g. {missing[:3]}"
        )
    model.load_state_dict(
        {k: torch.as_tensor(np.asarray(v)) for k, v in parsed["tensors"].items() if k in ours}, strict=False
    )
    return next_token_logits(model, prompts), parsed["config"]


def tokenizer_differences(path: str, export_dir: str) -> list[str]:
    """Where the tokenizer transformers builds from the GGUF renders the fixed chat prompts
    to other ids than the export's tokenizer (empty: the same)."""
    import transformers

    from stages.shared.prompts import PROMPTS

    directory, name = os.path.split(os.path.abspath(path))
    theirs = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    ours = transformers.AutoTokenizer.from_pretrained(export_dir)
    if theirs.chat_template != ours.chat_template:
        return ["the chat template differs from the export's"]
    out = []
    for i, messages in enumerate(PROMPTS):
        a, b = (
            list(t.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
            for t in (theirs, ours)
        )
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            out.append(f"prompt {i + 1} renders to other ids from token {first} on")
    return out


def check(path: str, model, reference: list, prompts: list, limits: dict, tokenizer_of: str | None):
    """One GGUF against the HF export: (the logit figures, what failed: empty when it passed).
    `model` is the export's language model (its weights are replaced by the file's),
    `reference` its logits on `prompts`; `tokenizer_of`: the export directory whose tokenizer
    the file's must match, or None to skip that check."""
    from stages.shared.logits import summary

    with gguf_reading.one_parse_per_file():  # (the tensors' read and the tokenizer's two: one parse)
        try:
            logits, read = read_back(path, model, prompts)
        except (ValueError, KeyError, OSError, RuntimeError, IndexError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StageFailed(f"the GGUF check failed: transformers cannot read {path} back ({first[:200]})") from None
        figures = summary(reference, logits, limits["tie_margin"])
        problems = [f"config: {d}" for d in config_differences(read, model.config)]
        problems += gates.logit.threshold_failures(figures, limits)
        if tokenizer_of:
            problems += [f"tokenizer: {d}" for d in tokenizer_differences(path, tokenizer_of)]
    return figures, problems


def modelfile(family, gguf_name: str, generation: dict) -> str:
    """Ollama's Modelfile for the file: its chat template, the turn's end as a stop, and the
    export's sampling defaults where its generation_config has them."""
    lines = [
        f"FROM ./{gguf_name}",
        f'TEMPLATE """{family.OLLAMA_TEMPLATE}"""',
        f'PARAMETER stop "{family.END_OF_TURN}"',
    ]
    for key in ("temperature", "top_k", "top_p"):
        if generation.get(key) is not None:
            lines.append(f"PARAMETER {key} {generation[key]}")
    return "\n".join(lines) + "\n"


def main() -> None:
    params = load()
    g, model_name = params.gguf, params.model.maxtext_name
    types = list(dict.fromkeys(g["types"]))
    if not types:
        with outputs.staged_dir(OUT) as tmp:
            outputs.write_text(os.path.join(tmp, "README.md"), OFF)
        outputs.write_json(METRICS, {GROUP: {}})
        print("export_gguf: gguf.types is empty: no GGUF written", flush=True)
        return
    family = families.of(model_name)
    weights = checkpoint.parameter_count(paths.SFT_HF)
    need = sum(BYTES_PER_WEIGHT[t] for t in types) * weights
    hardware.check_output_disk(OUT, 1.1 * need, "the GGUF files")

    import torch
    import transformers

    from stages.shared.prompts import fixed_prompts

    transformers.utils.logging.disable_progress_bar()  # its bars would bury the stage's own lines

    model = families.language_model(paths.SFT_HF, model_name, torch.float32)
    tensors = {k: v.numpy().copy() for k, v in model.state_dict().items()}  # copies: read_back loads into model
    _, prompts = fixed_prompts(paths.SFT_HF)
    reference = next_token_logits(model, prompts)
    generation = outputs.read_json(os.path.join(paths.SFT_HF, "generation_config.json"), {})
    name = f"{model_name} fine-tuned"
    report, failures = {}, []
    with outputs.staged_dir(OUT) as tmp:
        for kind in types:
            path = os.path.join(tmp, gguf_export.file_name(STEM, kind))
            start = time.monotonic()
            written = gguf_export.write(path, kind, tensors, model.config, paths.SFT_HF, model_name, name)
            seconds = time.monotonic() - start
            figures, problems = check(
                path, model, reference, prompts, g["check"][kind], paths.SFT_HF if kind == types[0] else None
            )
            problems = [f"{kind}: {p}" for p in problems]
            report[kind] = {
                "file": os.path.basename(path),
                "bytes": written.bytes,
                "seconds": round(seconds, 1),
                "passed": not problems,
                **{k: v for k, v in figures.items() if k != "prompts"},
            }
            failures += problems
            print(
                f"export_gguf: {os.path.basename(path)}: {written.bytes / 1e6:.1f} MB in {seconds:.1f} s; read back by "
                f"transformers: max KL {figures['kl_max']:.2g}, top-1 agreement {figures['top1_agreement']:.4f}"
                + (" FAILED" if problems else ""),
                flush=True,
            )
        outputs.write_json(METRICS, {GROUP: report})
        if failures:
            raise gates.GateFailed(
                "GGUF check",
                failures,
                f": the GGUF does not compute what the HF export does. Details in {METRICS}; nothing was written to "
                f"{OUT}",
            )
        outputs.write_text(
            os.path.join(tmp, "Modelfile"), modelfile(family, gguf_export.file_name(STEM, types[0]), generation)
        )
    print(f"export_gguf: every file passed its check; wrote {OUT} ({', '.join(types)}, and a Modelfile)", flush=True)


if __name__ == "__main__":
    run(main, "export_gguf")
