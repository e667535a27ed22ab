"""What each GGUF type costs in quality, in a finished run: its held-out loss and a greedy
answer beside the HF export's, all computed by transformers (the GGUF's tensors read back by
transformers' GGUF reader into the export's architecture, as export_gguf checks them).

    python -m bench.gguf_quality            # in a workspace where export_gguf has run

Held-out loss: the mean cross-entropy of the answers' tokens (each assistant turn as the chat
template renders it, its end-of-turn marker included) of data/chat/eval.jsonl, at most
`--rows` conversations cut to `--max-tokens`. The figures: docs/benchmarks.md ("GGUF export").
"""

import argparse
import json
import os

from stages import export_gguf
from stages.lib import paths
from stages.lib.params import load
from stages.shared import families


def answer_spans(tokenizer, messages: list[dict]) -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's ids and the [start, end) of each assistant turn in them."""

    def ids(msgs, prompt):
        return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=True)["input_ids"])

    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            spans.append((len(ids(messages[:i], True)), len(ids(messages[: i + 1], False))))
    return ids(messages, False), spans


def heldout_loss(model, rows) -> float:
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for ids, spans in rows:
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            targets = torch.tensor([t for start, end in spans for t in range(max(start, 1), end)], dtype=torch.long)
            picked = logp[targets - 1, torch.tensor(ids)[targets]]
            total -= float(picked.sum())
            count += len(targets)
    return total / count


def greedy(model, tokenizer, prompt: str, tokens: int) -> str:
    import torch

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    ids = torch.tensor([list(ids["input_ids"])])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


def main() -> None:
    import torch
    import transformers

    parser = argparse.ArgumentParser(prog="python -m bench.gguf_quality")
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--prompt", default="Explain in three sentences why the sky is blue.")
    parser.add_argument("--new-tokens", type=int, default=80)
    args = parser.parse_args()
    params = load()
    tokenizer = transformers.AutoTokenizer.from_pretrained(paths.SFT_HF)
    rows = []
    with open(os.path.join(paths.DATA, "eval.jsonl"), encoding="utf-8") as f:
        for line in list(f)[: args.rows]:
            ids, spans = answer_spans(tokenizer, json.loads(line)["messages"])
            spans = [(s, min(e, args.max_tokens)) for s, e in spans if s < args.max_tokens]
            rows.append((ids[: args.max_tokens], spans))
    model = families.language_model(paths.SFT_HF, params.model.maxtext_name, torch.float32)
    checked = json.load(open(os.path.join("metrics", "gguf_check.json")))["gguf"]
    print(f"held-out: {len(rows)} conversations of {paths.DATA}/eval.jsonl, at most {args.max_tokens} tokens each\n")
    print("| model | MB | max KL vs export | held-out loss | greedy answer |\n|---|---|---|---|---|")
    results = [("HF export (bf16)", None)] + [(kind, f) for kind, f in checked.items()]
    for name, figures in results:
        if figures is not None:
            export_gguf.read_back(os.path.join(paths.GGUF, figures["file"]), model, [[2]])
        loss = heldout_loss(model, rows)
        said = greedy(model, tokenizer, args.prompt, args.new_tokens).replace("\n", " ")
        size = f"{figures['bytes'] / 1e6:.0f}" if figures else ""
        kl = f"{figures['kl_max']:.2g}" if figures else ""
        print(f"| {name} | {size} | {kl} | {loss:.4f} | {said[:160]} |", flush=True)


if __name__ == "__main__":
    main()
