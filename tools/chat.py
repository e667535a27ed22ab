"""Talk to the fine-tuned model: a chat in its chat template, streamed token by token, on CPU.

    python -m tools.chat                      # models/sft-hf, the pipeline's result
    python -m tools.chat --compare            # base and fine-tuned answer each message, one after the other
    python -m tools.chat --model models/base-hf --max-new-tokens 400
    echo "Why is the sky blue?" | python -m tools.chat --compare   # one message from stdin, then done

What a user does first after a run. Each message is a user turn; the conversation so far (the
model's own earlier answers included) goes through the template as a whole, as training saw
it (stages/shared/rendering.py), and the answer streams until the template's end of turn,
greedy as the benchmark's answers are (or sampled: --temperature). `/reset` starts over,
`/quit` (or Ctrl-D) leaves. Needs models/sft-hf (dvc repro, or `dvc pull convert_out` for a
run made elsewhere); --compare needs models/base-hf too.
"""

import argparse
import os
import sys
import threading

from stages.lib import paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import families
from stages.shared.errors import UserError


def load_model(model_dir: str, model_name: str):
    import transformers

    if not os.path.exists(os.path.join(model_dir, "config.json")):
        raise UserError(f"{model_dir}: no model there; run `dvc repro` (or `dvc pull convert_out`) first")
    return families.language_model(model_dir, model_name), transformers.AutoTokenizer.from_pretrained(model_dir)


def answer(model, tokenizer, messages: list[dict], args, end_of_turn: str, out=sys.stdout) -> str:
    """Streams the model's answer to the conversation to `out`; returns it."""
    import torch
    import transformers

    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    streamer = transformers.TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=False)
    end_ids = [tokenizer.convert_tokens_to_ids(end_of_turn), tokenizer.eos_token_id]
    sampling = {"do_sample": True, "temperature": args.temperature} if args.temperature > 0 else {"do_sample": False}
    settings = dict(**inputs, max_new_tokens=args.max_new_tokens, streamer=streamer, eos_token_id=end_ids, **sampling)
    worker = threading.Thread(target=lambda: torch.no_grad()(model.generate)(**settings), daemon=True)
    worker.start()
    ends = [end_of_turn, *([tokenizer.eos_token] if tokenizer.eos_token else [])]
    said = ""
    for piece in streamer:
        cut = min((piece.index(e) for e in ends if e in piece), default=len(piece))
        out.write(piece[:cut])
        out.flush()
        said += piece[:cut]
        if cut < len(piece):
            break
    worker.join()
    out.write("\n")
    return said.strip()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=paths.SFT_HF, help=f"a Hugging Face checkpoint (default {paths.SFT_HF})")
    parser.add_argument("--compare", action="store_true", help=f"also {paths.BASE_HF}, answering the same messages")
    parser.add_argument("--max-new-tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--system", help="a system message to start the conversation with")
    args = parser.parse_args()
    model_name = load()["model"]["maxtext_name"]
    end_of_turn = families.of(model_name).END_OF_TURN
    names = {"fine-tuned": args.model} | ({"base": paths.BASE_HF} if args.compare else {})
    print(f"chat: loading {', '.join(names.values())} (transformers, CPU)", file=sys.stderr, flush=True)
    models = {who: load_model(path, model_name) for who, path in names.items()}
    start = [{"role": "system", "content": args.system}] if args.system else []
    histories = {who: list(start) for who in models}
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat: type a message; /reset starts over, /quit leaves", file=sys.stderr, flush=True)
    while True:
        try:
            text = input("you> " if interactive else "")
        except EOFError:
            return
        if text.strip() in ("/quit", "/exit"):
            return
        if text.strip() == "/reset":
            histories = {who: list(start) for who in models}
            continue
        if not text.strip():
            continue
        for who, (model, tokenizer) in models.items():
            sys.stdout.write(f"{who}> " if len(models) > 1 or interactive else "")
            sys.stdout.flush()
            histories[who].append({"role": "user", "content": text})
            said = answer(model, tokenizer, histories[who], args, end_of_turn)
            histories[who].append({"role": "assistant", "content": said})


if __name__ == "__main__":
    run(main, "chat")
