"""A conversation as the model is served it: the chat template over the whole conversation,
and which of its tokens training learns from.

Serving renders the whole conversation once (`tokenizer.apply_chat_template(messages)`):
one BOS, each turn in the template's markup, and, for Qwen 3, the empty think block in the
last assistant turn only. MaxText 0.2.5's SFT pipeline renders each user/assistant round
through the template on its own and joins the rounds, which trains on sequences the model
never sees: a second `<bos>` (Gemma 3) or `<|begin_of_text|>` (Llama 3) before every later
round, an empty think block in every assistant turn (Qwen 3). This module renders as served
(`train.chat_rendering: whole`, the default); stages/in_maxtext/served_chat.py feeds it to
MaxText's pipeline, and the token_lengths stage counts with it.

What is trained: every assistant turn's content, as the template writes it (Gemma 3 and
Llama 3 trim it), and the end-of-turn marker after it (`<end_of_turn>`, `<|eot_id|>`,
`<|im_end|>`: the first of the template's markup tokens after the content); never a system or user
token, the template's markup before an answer (`<start_of_turn>model\\n`, a think block),
or what follows the marker (the newline Gemma 3 and Qwen 3 write after it).

Where an answer's content is in the rendered text is found from the template itself, for
any template: the conversation is rendered again with that answer replaced by a sentinel,
and the two renderings must agree everywhere else (a template that renders other turns
differently depending on an answer, e.g. Qwen 3's with a `</think>` inside one, is refused
for that row with a RenderError).

    python -c "import transformers; from stages.lib import rendering; \\
        t = transformers.AutoTokenizer.from_pretrained('models/base-hf'); \\
        print(rendering.show(t, [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]))"
"""

from dataclasses import dataclass

SENTINEL = "\ue000answer\ue001"  # private-use characters: in no template and no sane answer
RENDERINGS = ("whole", "per_round")  # train.chat_rendering: as served | MaxText 0.2.5's own


class RenderError(ValueError):
    """A conversation whose answers cannot be located in the template's rendering."""


@dataclass(frozen=True)
class Rendered:
    """One conversation rendered as served: its token ids, and for each token whether
    training learns it (as a target), with the text and each token's character span."""

    text: str
    ids: list[int]
    trained: list[bool]
    offsets: list[tuple[int, int]]
    turn_ends: list[int]  # tokens up to and including each assistant turn's end-of-turn marker

    def pieces(self) -> list[tuple[str, bool]]:
        """The text cut into alternate untrained and trained runs of whole tokens: (text,
        trained). Joined, they are the text; tokenized together, they are `ids`."""
        out: list[tuple[str, bool]] = []
        start = 0
        for i in range(1, len(self.ids) + 1):
            if i == len(self.ids) or self.trained[i] != self.trained[i - 1]:
                end = len(self.text) if i == len(self.ids) else self.offsets[i][0]
                out.append((self.text[start:end], self.trained[i - 1]))
                start = end
        return out


def _answer_spans(tokenizer, messages: list[dict], text: str) -> list[tuple[int, int]]:
    """(start, end) in `text` of each assistant message's content as the template wrote it."""
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        probe = [dict(m) for m in messages]
        probe[k]["content"] = SENTINEL
        other = tokenizer.apply_chat_template(probe, tokenize=False)
        start = other.find(SENTINEL)
        end = len(text) - (len(other) - start - len(SENTINEL))
        if start < 0 or end < start or text[:start] != other[:start] or text[end:] != other[start + len(SENTINEL) :]:
            raise RenderError(
                f"messages[{k}]: the chat template renders the rest of the conversation differently depending on "
                "this answer, so its tokens cannot be located"
            )
        spans.append((start, end))
    return spans


def _markup_ids(tokenizer) -> set[int]:
    """The template's markup tokens: added tokens that are not whitespace (Gemma 3 adds runs
    of newlines and spaces as tokens too, and marks `<end_of_turn>` not special)."""
    return {i for i, token in tokenizer.added_tokens_decoder.items() if token.content.strip(" \t\r\n\u2581")}


def _mark(text: str, spans, ids: list[int], offsets: list, markup: set[int]) -> Rendered:
    """The tokens of `text` (ids and character offsets) marked trained: each answer's span
    (start, end) and what follows it up to and including the next markup token."""
    trained = [False] * len(ids)
    turn_ends = []
    i = 0
    for start, end in spans:
        while i < len(ids) and offsets[i][0] < start:
            i += 1
        while i < len(ids) and offsets[i][0] < end:  # the answer's tokens
            trained[i] = True
            i += 1
        while i < len(ids) and ids[i] not in markup:  # up to the end-of-turn marker ...
            trained[i] = True
            i += 1
        if i == len(ids):
            raise RenderError("the chat template writes no markup token (an end-of-turn marker) after an answer")
        trained[i] = True  # ... and the marker itself
        i += 1
        turn_ends.append(i)
    return Rendered(text, ids, trained, offsets, turn_ends)


def render_many(tokenizer, conversations: list[list[dict]]) -> list[Rendered]:
    """`render` of each conversation, the tokenizing done in one batch (the Rust tokenizer, on
    every core): what the token_lengths stage runs over a whole split."""
    texts, spans = [], []
    for messages in conversations:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        texts.append(text)
        spans.append(_answer_spans(tokenizer, messages, text))
    if not texts:
        return []
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    markup = _markup_ids(tokenizer)
    return [
        _mark(text, answer_spans, list(ids), [tuple(o) for o in offsets], markup)
        for text, answer_spans, ids, offsets in zip(
            texts, spans, encoded["input_ids"], encoded["offset_mapping"], strict=True
        )
    ]


def render(tokenizer, messages: list[dict]) -> Rendered:
    """The whole conversation through the tokenizer's chat template, as `apply_chat_template
    (messages, tokenize=True)` gives it, with the trained tokens marked."""
    return render_many(tokenizer, [messages])[0]


def end_of_turn(tokenizer) -> str:
    """The text of the template's end-of-turn marker: what ends an answer's generation, and
    what must not be left at the end of an answer's text (the benchmark's stop sequence)."""
    probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    rendered = render(tokenizer, probe)
    last = rendered.turn_ends[0] - 1
    start, end = rendered.offsets[last]
    return rendered.text[start:end]


def show(tokenizer, messages: list[dict]) -> str:
    """The rendering with each trained run in [[...]]: what training learns, at a glance."""
    return "".join(f"[[{text}]]" if trained else text for text, trained in render(tokenizer, messages).pieces())
