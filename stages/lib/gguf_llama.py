"""A GGUF as llama.cpp reads it: what llama.cpp, Ollama and LM Studio build from the file alone,
through llama.cpp itself (llama-cpp-python, built from its sdist: requirements/llama-cpp.lock).

    with Reading(path) as model:
        model.logits(ids)            # llama.cpp's logits at every position of a prompt
        model.chat_ids(messages)     # the chat template as llama.cpp renders it, tokenized by llama.cpp
        model.ends_turn(token_id)    # whether llama.cpp stops an answer at this token

What a reader takes from the metadata (RoPE base and scaling, sliding window, head sizes, the
attention scale, the norm epsilon, end-of-generation tokens, the chat template) shows in these:
a metadata fault the export's own check cannot see, since it loads the file's tensors into the
export's architecture, changes llama.cpp's logits, its rendering, or where it stops.
"""

import contextlib
import ctypes
import os


class Unreadable(Exception):
    """llama.cpp could not load the file (its message in one line)."""


@contextlib.contextmanager
def quiet():
    """llama.cpp writes its load log to the process's stderr (fd 2): kept out of the stage's."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class Reading:
    """One GGUF loaded by llama.cpp on the CPU, with the logits of every position kept."""

    def __init__(self, path: str, n_ctx: int = 2048):
        self.path, self.n_ctx = path, n_ctx

    def __enter__(self) -> "Reading":
        import llama_cpp

        try:
            with quiet():
                self.llm = llama_cpp.Llama(
                    model_path=self.path,
                    n_ctx=self.n_ctx,
                    n_batch=self.n_ctx,
                    logits_all=True,
                    n_gpu_layers=0,
                    n_threads=max(1, min(4, os.cpu_count() or 1)),
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as e:
            raise Unreadable((str(e).strip().splitlines() or [type(e).__name__])[0][:200]) from None
        return self

    def __exit__(self, *exc) -> None:
        self.llm.close()

    def logits(self, ids: list[int]):
        """llama.cpp's float32 logits at every position of `ids` (a fresh context each time)."""
        import numpy as np

        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """The conversation rendered by llama.cpp's own template engine from the file's
        `tokenizer.chat_template` (llama_chat_apply_template, as its tools render a chat),
        with the generation prompt, then tokenized by llama.cpp from the file's vocabulary."""
        import llama_cpp

        template = llama_cpp.llama_model_chat_template(self.llm.model, None)
        chat = (llama_cpp.llama_chat_message * len(messages))(
            *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages]
        )
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(template, chat, len(messages), True, buf, size)
            if n < 0:
                raise Unreadable("llama.cpp does not know the file's chat template")
            if n <= size:
                break
            size = n
        # As llama.cpp's tools tokenize a rendered chat: special tokens parsed, and BOS added
        # where the file's vocabulary asks for it (Gemma's template itself writes none).
        return self.llm.tokenize(buf.raw[:n], add_bos=True, special=True)

    def stated_ends(self) -> set[int]:
        """The end tokens the file's metadata names (EOS, end of turn, end of message)."""
        keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        return {int(self.llm.metadata[k]) for k in keys if k in self.llm.metadata}

    def ends_turn(self, token: int) -> bool:
        """Whether llama.cpp ends generation at `token` (its end-of-generation set, from the
        file's EOS/EOT ids and its vocabulary's end tokens)."""
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(self.llm.model), token))

    def end_tokens(self) -> set[int]:
        """Every token llama.cpp ends generation at: the file's stated ones, and those its
        vocabulary code adds by name (Gemma's </s>, ...)."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        return {t for t in range(self.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """llama.cpp's own greedy answer, up to its end of generation (included) or the cap."""
        out = []
        for token in self.llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(token)
            if self.ends_turn(token) or len(out) >= max_new_tokens:
                break
        return out
