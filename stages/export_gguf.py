"""Stage export_gguf: the tuned model as llama.cpp GGUF files, checked, with an Ollama Modelfile.

    python -m stages.export_gguf

Reads the checked HF export (models/sft-hf: the SFT or preference-tuned model, a LoRA run's
adapter merged) and writes, for each type of `gguf.types`, a GGUF of its language model
(stages/lib/gguf_export.py). Each file is then read back by llama.cpp itself (llama-cpp-python,
built from its sdist: stages/lib/gguf_llama.py), which builds the model from the file alone as
llama.cpp, Ollama and LM Studio do, and checked against the HF export:
  - llama.cpp's logits on the fixed chat prompts (a multi-turn one, and one longer than a
    sliding window) within `gguf.check.<type>` (KL, top-1 agreement: the logit gate's figures,
    limits per type from each type's measured floor): a tensor, or a metadata value llama.cpp
    computes with (RoPE base and scaling, the sliding window, head sizes, the attention scale,
    the norm epsilon), that is wrong shows here;
  - the chat template as llama.cpp's own engine renders it from the file, tokenized by
    llama.cpp from the file's vocabulary, gives the export tokenizer's ids;
  - llama.cpp ends an answer exactly at the export's end tokens (the family's end of turn).
A file that fails any of them fails the stage in one line and nothing is written: the files
are published together, in one rename, only once all passed. Writes
  models/gguf/                 model-<TYPE>.gguf per type, and Modelfile (Ollama: `ollama create`)
  metrics/gguf_check.json      under `gguf`, per type: bytes, seconds to write, KL, top-1 agreement
With `gguf.types: []` it writes models/gguf/README.md alone (a note, the same bytes every time).
"""

import os
import time

from stages.lib import gates, gguf_export, gguf_llama, hardware, outputs, paths
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


def next_token_logits(model, prompts: list[list[int]]) -> list:
    """The export's float32 logits at every position of each prompt (transformers)."""
    import torch

    with torch.no_grad():
        return [model(input_ids=torch.tensor([p])).logits[0].float().numpy() for p in prompts]


def expected_ends(export_dir: str, model_name: str) -> tuple[set[int], set[int]]:
    """The tokens an answer must end at (the family's end of turn, the tokenizer's EOS), and
    those it may end at besides (the export's generation config's ends: Llama 3.1's end of a
    tool-calling message)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    required = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(families.of(model_name).END_OF_TURN)}
    eos = outputs.read_json(os.path.join(export_dir, "generation_config.json"), {}).get("eos_token_id")
    allowed = required | set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return {e for e in required if e is not None}, {e for e in allowed if e is not None}


def check(
    path: str, reference: list, prompts: list, limits: dict, ends: tuple[set[int], set[int]]
) -> tuple[dict, list[str]]:
    """One GGUF read by llama.cpp itself, as llama.cpp, Ollama and LM Studio read it, against the
    HF export: (the logit figures, what failed: empty when it passed).
      - its logits at every position of the fixed prompts (the export's token ids), within
        `limits` of the export's (`reference`): KL, top-1 agreement, as the logit gates;
      - the chat template as llama.cpp renders it from the file, tokenized by llama.cpp from the
        file's vocabulary, gives the export tokenizer's ids for each fixed conversation;
      - llama.cpp ends an answer at exactly the export's end tokens (`ends`): the family's end
        of turn among them, and no other token."""
    from stages.shared.logits import summary
    from stages.shared.prompts import PROMPTS

    try:
        with gguf_llama.Reading(path, n_ctx=max(map(len, prompts)) + 16) as model:
            logits = [model.logits(p) for p in prompts]
            rendered = [model.chat_ids(m) for m in PROMPTS]
            stops, stated = model.end_tokens(), model.stated_ends()
    except gguf_llama.Unreadable as e:
        raise StageFailed(f"the GGUF check failed: llama.cpp cannot read {path} ({e})") from None
    figures = summary(reference, logits, limits["tie_margin"])
    problems = gates.logit.threshold_failures(figures, limits)
    for i, (ours, theirs) in enumerate(zip(rendered, prompts, strict=False)):
        if ours != theirs:
            first = next(
                (j for j, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y), min(len(ours), len(theirs))
            )
            problems.append(f"chat template: llama.cpp renders prompt {i + 1} to other ids from token {first} on")
    required, allowed = ends
    missing, wrong = sorted(required - stops), sorted(stated - allowed)
    if missing:
        problems.append(f"end of turn: llama.cpp does not end answers at token(s) {missing}, where the export does")
    if wrong:  # (tokens llama.cpp adds to its end set by their names, Gemma's </s>, are its own choice)
        problems.append(f"end of turn: the file names token(s) {wrong} as an end, which the export does not")
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
    tensors = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    _, prompts = fixed_prompts(paths.SFT_HF)
    reference = next_token_logits(model, prompts)
    ends = expected_ends(paths.SFT_HF, model_name)
    generation = outputs.read_json(os.path.join(paths.SFT_HF, "generation_config.json"), {})
    name = f"{model_name} fine-tuned"
    report, failures = {}, []
    with outputs.staged_dir(OUT) as tmp:
        for kind in types:
            path = os.path.join(tmp, gguf_export.file_name(STEM, kind))
            start = time.monotonic()
            written = gguf_export.write(path, kind, tensors, model.config, paths.SFT_HF, model_name, name)
            seconds = time.monotonic() - start
            figures, problems = check(path, reference, prompts, g["check"][kind], ends)
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
                f"llama.cpp: max KL {figures['kl_max']:.2g}, top-1 agreement {figures['top1_agreement']:.4f}"
                + (" FAILED" if problems else "; its chat rendering and end of turn are the export's"),
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
