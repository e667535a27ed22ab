"""Verifiable instructions: what the constraints stage adds to a user's turn, how it makes the
conversation's own answer obey, and how every answer is checked (the constraint examples, and
the model's own sampled answers that become preference pairs).

Each instruction kind has
  - an id: IFEval's for its types (lm-eval's `instructions_registry`), `pipeline:<name>` for ours;
  - phrasings, in this project's own words (several a kind: a model must learn the request, not
    one sentence), never IFEval's (tests/test_constraints.py holds that no 8-word run of an
    IFEval prompt appears in the data);
  - `draw`: its arguments for one answer (a count, a word, a phrase), chosen so that the answer
    can obey, or None where it cannot (a one-word answer needs a yes/no question);
  - `apply`: the answer made to obey, by code;
  - a checker: lm-eval's own IFEval checker class for IFEval's kinds (the benchmark's code, run on
    the transformed answer), ours for the rest.
Kinds apply in `STAGES` order: which sentences the answer keeps, marks within them, their
layout, what is added around it, a wrapper, its case and punctuation, and last the kinds that
only count what is there (keywords, letters: their arguments are drawn from the final text).
`conflicts` keeps apart kinds that cannot hold together: IFEval's own table for its kinds, and
ours (a kind that adds a sentence or a paragraph against one that counts them, ...). An example whose transformed answer
fails any of its checks is dropped and counted by the stage.
"""

import collections
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")
STOP_WORDS = frozenset(
    "the a an and or but if of to in on at by for with from as is are was were be been being it its this that these "
    "those there their they them you your we our he she his her i me my not no yes do does did can could would should "
    "will may might must have has had than then so such which who whom what when where why how also into about over "
    "more most some any each other all just very only own same too out up down off again further once here both few "
    "many much".split()
)


def sentences(text: str) -> list[str]:
    """The text's sentences as IFEval counts them (NLTK's punkt: stages/lib/benchmark_data.py
    puts its model where NLTK looks)."""
    from lm_eval.tasks.ifeval import instructions_util

    return [s.strip() for s in instructions_util.split_into_sentences(text) if s.strip()]


def count_sentences(text: str) -> int:
    from lm_eval.tasks.ifeval import instructions_util

    return instructions_util.count_sentences(text)


def count_words(text: str) -> int:
    from lm_eval.tasks.ifeval import instructions_util

    return instructions_util.count_words(text)


def plain(text: str) -> str:
    """An answer reduced to plain sentences: no markdown lists, headers, code or tables, which
    the layout kinds would otherwise count (a stray "- " line is a bullet to IFEval)."""
    if "```" in text:
        return ""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "|", ">")):
            continue
        line = re.sub(r"^([-*+]|\d+[.)])\s+", "", line)
        lines.append(line.replace("*", "").replace("_", " "))
    return " ".join(lines)


def content_words(text: str) -> list[str]:
    return [w for w in WORD.findall(text) if w.lower() not in STOP_WORDS and len(w) > 3]


@dataclass(frozen=True)
class Kind:
    id: str
    stage: int  # when it applies: STAGES
    phrasings: tuple[str, ...]
    draw: Callable[[random.Random, str, str], dict | None]  # (rng, answer, request) -> args, or None
    apply: Callable[[str, dict], str]  # (answer, args) -> the answer obeying
    check: Callable[[str, dict], bool] | None = None  # ours; None: IFEval's checker for `id`

    @property
    def ifeval(self) -> bool:
        return not self.id.startswith("pipeline:")


STAGES = ("content", "inline", "layout", "around", "wrap", "case", "counted")  # the order kinds apply in


# --- what the answer says -------------------------------------------------------------------


def _keep_sentences(answer: str, n: int) -> str:
    return " ".join(sentences(answer)[:n])


def _draw_words(rng, answer, request):
    words = count_words(answer)
    if words < 25:
        return None
    if rng.random() < 0.5:
        return {"relation": "less than", "num_words": rng.choice([40, 60, 80, 100, 120])}
    return {"relation": "at least", "num_words": max(10, words // 2 // 5 * 5)}


def _apply_words(answer, a):
    if a["relation"] == "at least":
        return answer
    kept = []
    for s in sentences(answer):
        if count_words(" ".join([*kept, s])) >= a["num_words"]:
            break
        kept.append(s)
    return " ".join(kept)


def _draw_sentences(rng, answer, request):
    n = count_sentences(answer)
    if n < 3:
        return None
    if rng.random() < 0.5:
        return {"relation": "less than", "num_sentences": rng.randint(2, min(n, 6))}
    return {"relation": "at least", "num_sentences": rng.randint(2, n)}


def _apply_sentences(answer, a):
    return answer if a["relation"] == "at least" else _keep_sentences(answer, a["num_sentences"] - 1)


def _draw_exact_sentences(rng, answer, request):
    n = count_sentences(answer)
    return {"count": rng.randint(1, min(n, 5))} if n >= 1 else None


def _draw_forbidden(rng, answer, request):
    """Words the answer uses in at most a third of its sentences: forbidding them removes
    those sentences, and the rest still answers."""
    said = sentences(answer)
    if len(said) < 3:
        return None
    counts = collections.Counter(w.lower() for s in said for w in set(content_words(s)))
    rare = sorted(w for w, c in counts.items() if c <= len(said) // 3 and w.isalpha())
    if not rare:
        return None
    words = rng.sample(rare, min(len(rare), rng.choice([1, 2])))
    return {"forbidden_words": words}


def _apply_forbidden(answer, a):
    def clean(s):
        return not any(re.search(r"\b" + w + r"\b", s, flags=re.IGNORECASE) for w in a["forbidden_words"])

    return " ".join(s for s in sentences(answer) if clean(s))


def _draw_two_responses(rng, answer, request):
    return {} if count_sentences(answer) >= 3 else None


def _apply_two_responses(answer, a):
    said = sentences(answer)
    return f"{said[0]}\n******\n{' '.join(said[: min(len(said), 4)])}"


def _draw_one_word(rng, answer, request):
    first = answer.strip().split(None, 1)[0].strip(".,!:;").lower() if answer.strip() else ""
    return {"word": first.capitalize()} if first in ("yes", "no") else None


# --- its layout -------------------------------------------------------------------------------


def _groups(items: list[str], n: int) -> list[list[str]]:
    """items split into n consecutive non-empty groups, as even as can be."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def _draw_paragraphs(rng, answer, request):
    n = count_sentences(answer)
    return {"num_paragraphs": rng.randint(2, min(n, 5))} if n >= 2 else None


def _apply_paragraphs(answer, a):
    return "\n\n***\n\n".join(" ".join(g) for g in _groups(sentences(answer), a["num_paragraphs"]))


def _draw_nth_paragraph(rng, answer, request):
    said = sentences(answer)
    if len(said) < 2:
        return None
    n = rng.randint(2, min(len(said), 4))
    nth = rng.randint(1, n)
    first = _groups(said, n)[nth - 1][0].split()[0]
    word = re.sub(r"[^A-Za-z]", "", first)
    return {"num_paragraphs": n, "nth_paragraph": nth, "first_word": word.lower()} if word else None


def _apply_nth_paragraph(answer, a):
    return "\n\n".join(" ".join(g) for g in _groups(sentences(answer), a["num_paragraphs"]))


def _draw_bullets(rng, answer, request):
    n = count_sentences(answer)
    return {"num_bullets": rng.randint(2, min(n, 5))} if n >= 2 else None


def _apply_bullets(answer, a):
    return "\n".join(f"* {s}" for s in sentences(answer)[: a["num_bullets"]])


def _draw_numbered(rng, answer, request):
    n = count_sentences(answer)
    return {"count": rng.randint(2, min(n, 6))} if n >= 2 else None


def _apply_numbered(answer, a):
    return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences(answer)[: a["count"]], start=1))


def _check_numbered(answer, a):
    items = re.findall(r"^\s*(\d+)\.\s+\S", answer, flags=re.MULTILINE)
    return [int(i) for i in items] == list(range(1, a["count"] + 1))


def _draw_sections(rng, answer, request):
    n = count_sentences(answer)
    if n < 2:
        return None
    return {"section_spliter": rng.choice(["Section", "SECTION"]), "num_sections": rng.randint(2, min(n, 4))}


def _apply_sections(answer, a):
    groups = _groups(sentences(answer), a["num_sections"])
    return "\n\n".join(f"{a['section_spliter']} {i}\n{' '.join(g)}" for i, g in enumerate(groups, start=1))


def _draw_title(rng, answer, request):
    words = content_words(request)[:4] or content_words(answer)[:3]
    return {"title": " ".join(w.capitalize() for w in words)} if words else None


def _apply_title(answer, a):
    return f"<<{a['title']}>>\n\n{answer}"


def _draw_highlights(rng, answer, request):
    n = count_sentences(answer)
    return {"num_highlights": rng.randint(1, min(n, 3))} if n >= 1 else None


def _apply_highlights(answer, a):
    """The first words of the first N sentences marked, up to a comma or five words (in place:
    whatever follows keeps its place)."""
    for said in sentences(answer)[: a["num_highlights"]]:
        words = said.split()
        span = next((k + 1 for k, w in enumerate(words[:5]) if w.endswith(",")), min(5, len(words)))
        head = " ".join(words[:span]).rstrip(",")
        if head and "*" not in head:
            answer = answer.replace(head, f"*{head}*", 1)
    return answer


def _draw_placeholders(rng, answer, request):
    names = sorted({w for w in re.findall(r"\b[A-Z][a-z]{2,}\b", answer)} - {w.capitalize() for w in STOP_WORDS})
    numbers = sorted(set(re.findall(r"\b\d[\d,.]*\d\b|\b\d\b", answer)))
    found = [("name", n) for n in names[1:]] + [("number", n) for n in numbers]  # (not the first word)
    if not found:
        return None
    chosen = rng.sample(found, min(len(found), rng.randint(1, 3)))
    return {"num_placeholders": len(chosen), "replace": [[what, text] for what, text in chosen]}


def _apply_placeholders(answer, a):
    for what, text in a["replace"]:
        answer = re.sub(r"\b" + re.escape(text) + r"\b", f"[{what}]", answer)
    return answer


# --- around it --------------------------------------------------------------------------------

END_PHRASES = (
    "I hope this helps.",
    "Just ask if more detail would help.",
    "That is the short version.",
    "Feel free to ask a follow-up question.",
)
FIRST_WORDS = ("Certainly", "Sure", "Briefly", "Overall", "Well")


POSTSCRIPTS = (
    "I can go into more detail on any part of this.",
    "Tell me if you would like an example.",
    "A shorter or a longer version is easy to make.",
    "Ask again if anything here is unclear.",
)


def _draw_postscript(rng, answer, request):
    return {"postscript_marker": rng.choice(["P.S.", "P.P.S"]), "note": rng.choice(POSTSCRIPTS)}


def _apply_postscript(answer, a):
    return f"{answer.rstrip()}\n\n{a['postscript_marker']} {a['note']}"


def _draw_end(rng, answer, request):
    return {"end_phrase": rng.choice(END_PHRASES)}


def _apply_end(answer, a):
    return f"{answer.rstrip()}\n\n{a['end_phrase']}"


def _draw_first_word(rng, answer, request):
    return {"word": rng.choice(FIRST_WORDS)}


def _apply_first_word(answer, a):
    return f"{a['word']}, {answer.lstrip()}"


def _check_first_word(answer, a):
    words = answer.strip().split()
    return bool(words) and re.sub(r"[^A-Za-z]", "", words[0]).lower() == a["word"].lower()


def _draw_repeat(rng, answer, request):
    return {"prompt_to_repeat": request.strip()} if 0 < len(request.split()) <= 60 and "\n" not in request else None


def _apply_repeat(answer, a):
    return f"{a['prompt_to_repeat']}\n\n{answer}"


# --- wrapped ------------------------------------------------------------------------------------


def _apply_quotation(answer, a):
    return f'"{answer}"'


def _apply_json(answer, a):
    return "```json\n" + json.dumps({"answer": answer}, ensure_ascii=False, indent=2) + "\n```"


# --- case and punctuation -------------------------------------------------------------------------


def _draw_capital_words(rng, answer, request):
    words = sorted(set(content_words(answer)))
    if len(words) < 2:
        return None
    n = rng.randint(1, min(len(words), 4))
    return {"capital_relation": "at least", "capital_frequency": n, "words": rng.sample(words, n)}


def _apply_capital_words(answer, a):
    for w in a["words"]:
        answer = re.sub(r"\b" + re.escape(w) + r"\b", w.upper(), answer, count=1)
    return answer


def _draw_keywords(rng, answer, request):
    words = sorted({w.lower() for w in content_words(answer)})
    return {"keywords": rng.sample(words, min(len(words), rng.choice([1, 2])))} if words else None


def _draw_frequency(rng, answer, request):
    counts = collections.Counter(w.lower() for w in content_words(answer))
    if not counts:
        return None
    word, seen = rng.choice(sorted(counts.items()))
    if seen >= 2 and rng.random() < 0.5:
        return {"keyword": word, "relation": "at least", "frequency": seen}
    return {"keyword": word, "relation": "less than", "frequency": seen + rng.randint(1, 2)}


def _draw_letters(rng, answer, request):
    counts = collections.Counter(c for c in answer.lower() if "a" <= c <= "z")
    if not counts:
        return None
    letter = rng.choice(sorted(counts))
    seen = counts[letter]
    if seen >= 2 and rng.random() < 0.5:
        return {"letter": letter, "let_relation": "at least", "let_frequency": max(1, seen // 2)}
    return {"letter": letter, "let_relation": "less than", "let_frequency": seen + rng.randint(1, 5)}


def _same(answer, a):
    return answer


def _always(rng, answer, request):
    return {}


def _long_enough(rng, answer, request):
    """A case instruction's answer: long enough that its language is told reliably (IFEval's
    case checkers also ask that it be English)."""
    return {} if count_words(answer) >= 12 else None


def _check_exact_sentences(answer, a):
    return count_sentences(answer) == a["count"]


def _check_one_word(answer, a):
    return answer.strip().strip(".!").lower() == a["word"].lower()


KINDS = {
    k.id: k
    for k in (
        # what the answer says
        Kind(
            "length_constraints:number_words",
            0,
            (
                "Keep the reply {relation} {num_words} words long.",
                "Use {relation} {num_words} words in your answer.",
                "Your answer's length: {relation} {num_words} words.",
            ),
            _draw_words,
            _apply_words,
        ),
        Kind(
            "length_constraints:number_sentences",
            0,
            (
                "Answer in {relation} {num_sentences} sentences.",
                "The reply should run to {relation} {num_sentences} sentences.",
                "Write {relation} {num_sentences} sentences, no matter how much there is to say.",
            ),
            _draw_sentences,
            _apply_sentences,
        ),
        Kind(
            "pipeline:exact_sentences",
            0,
            (
                "Reply in exactly {count} sentences.",
                "Give me precisely {count} sentences, no more and no fewer.",
                "Your whole answer must be {count} sentences long.",
            ),
            _draw_exact_sentences,
            lambda answer, a: _keep_sentences(answer, a["count"]),
            _check_exact_sentences,
        ),
        Kind(
            "keywords:forbidden_words",
            0,
            (
                "Keep {forbidden_words} out of your reply.",
                "Avoid the word {forbidden_words} completely.",
                "Do without {forbidden_words} in what you write.",
            ),
            _draw_forbidden,
            _apply_forbidden,
        ),
        Kind(
            "combination:two_responses",
            0,
            (
                "Give two different answers, separated by a line of six asterisks (******).",
                "Write a short answer and a longer one, with ****** on its own line between them.",
            ),
            _draw_two_responses,
            _apply_two_responses,
        ),
        Kind(
            "pipeline:one_word",
            0,
            ("Answer with a single word.", "One word only, please.", "Reply using just one word."),
            _draw_one_word,
            lambda answer, a: f"{a['word']}.",
            _check_one_word,
        ),
        # its layout
        Kind(
            "length_constraints:number_paragraphs",
            2,
            (
                "Split the answer into {num_paragraphs} paragraphs with *** on a line between each pair.",
                "Write {num_paragraphs} paragraphs, divided by the markdown divider ***.",
            ),
            _draw_paragraphs,
            _apply_paragraphs,
        ),
        Kind(
            "length_constraints:nth_paragraph_first_word",
            2,
            (
                "Write {num_paragraphs} paragraphs separated by blank lines; paragraph number {nth_paragraph} "
                "must begin with the word {first_word}.",
                "Use {num_paragraphs} paragraphs (blank lines between them), and start paragraph {nth_paragraph} "
                "with '{first_word}'.",
            ),
            _draw_nth_paragraph,
            _apply_nth_paragraph,
        ),
        Kind(
            "detectable_format:number_bullet_lists",
            2,
            (
                "Give the answer as exactly {num_bullets} markdown bullet points (lines starting with '* ').",
                "Make it a list of {num_bullets} bullets, each line starting with an asterisk.",
            ),
            _draw_bullets,
            _apply_bullets,
        ),
        Kind(
            "pipeline:numbered_list",
            2,
            (
                "Answer as a numbered list of {count} items.",
                "List exactly {count} points, numbered 1., 2., and so on.",
                "Give {count} numbered items and nothing else.",
            ),
            _draw_numbered,
            _apply_numbered,
            _check_numbered,
        ),
        Kind(
            "detectable_format:multiple_sections",
            2,
            (
                "Organise the reply into {num_sections} parts, each headed '{section_spliter} N' with N its number.",
                "Use {num_sections} sections; start each one with {section_spliter} followed by its number.",
            ),
            _draw_sections,
            _apply_sections,
        ),
        Kind(
            "detectable_format:title",
            3,
            (
                "Put a title at the top inside double angle brackets, like <<A Title>>.",
                "Begin with a title written between << and >>.",
            ),
            _draw_title,
            _apply_title,
        ),
        Kind(
            "detectable_format:number_highlighted_sections",
            1,
            (
                "Mark at least {num_highlights} phrases in italics with single asterisks, *like this*.",
                "Emphasise {num_highlights} or more parts of the text using *asterisks* around them.",
            ),
            _draw_highlights,
            _apply_highlights,
        ),
        Kind(
            "detectable_content:number_placeholders",
            1,
            (
                "Swap specific names and numbers for bracketed placeholders like [name]; at least "
                "{num_placeholders} of them.",
                "Keep it generic: at least {num_placeholders} details should be bracketed placeholders like [number].",
            ),
            _draw_placeholders,
            _apply_placeholders,
        ),
        # around it
        Kind(
            "detectable_content:postscript",
            3,
            (
                "End with an afterthought introduced by {postscript_marker}",
                "Add a final note beginning with {postscript_marker}",
            ),
            _draw_postscript,
            _apply_postscript,
        ),
        Kind(
            "startend:end_checker",
            3,
            (
                "The very last words of your reply must be: {end_phrase}",
                'Finish with the sentence "{end_phrase}" and write nothing after it.',
            ),
            _draw_end,
            _apply_end,
        ),
        Kind(
            "pipeline:first_word",
            3,
            (
                "Make {word} the first word of your reply.",
                "Open your answer with the word '{word}'.",
                "Your response has to begin with {word}.",
            ),
            _draw_first_word,
            _apply_first_word,
            _check_first_word,
        ),
        Kind(
            "combination:repeat_prompt",
            3,
            (
                "Before you answer, copy out my request exactly, then reply to it.",
                "Start by restating my request exactly as I wrote it, and only then reply.",
            ),
            _draw_repeat,
            _apply_repeat,
        ),
        # wrapped
        Kind(
            "startend:quotation",
            4,
            ("Put the whole reply inside double quotes.", 'Enclose everything you write in "double quotation marks".'),
            _always,
            _apply_quotation,
        ),
        Kind(
            "detectable_format:json_format",
            4,
            ("Return the answer as JSON.", "Format the entire reply as a JSON object."),
            _always,
            _apply_json,
        ),
        # case and punctuation
        Kind(
            "change_case:english_lowercase",
            5,
            (
                "Write everything in lowercase letters, with no capitals at all.",
                "No uppercase letters anywhere in the reply, please.",
            ),
            _long_enough,
            lambda answer, a: answer.lower(),
        ),
        Kind(
            "change_case:english_capital",
            5,
            ("Write the entire answer in capital letters.", "Reply in uppercase only, every letter."),
            _long_enough,
            lambda answer, a: answer.upper(),
        ),
        Kind(
            "change_case:capital_word_frequency",
            1,
            (
                "Stress key terms by writing {capital_relation} {capital_frequency} words fully in CAPITALS.",
                "Use {capital_relation} {capital_frequency} all-caps words for emphasis.",
            ),
            _draw_capital_words,
            _apply_capital_words,
        ),
        Kind(
            "punctuation:no_comma",
            5,
            ("Do not use a single comma.", "Write without any commas."),
            _always,
            lambda answer, a: re.sub(r",(?=\d{3}\b)", "", answer).replace(",", ""),
        ),
        Kind(
            "keywords:existence",
            6,
            ("Mention {keywords} in the answer.", "Be sure the reply includes {keywords}."),
            _draw_keywords,
            _same,
        ),
        Kind(
            "keywords:frequency",
            6,
            (
                "The word '{keyword}' should appear {relation} {frequency} times.",
                "Use '{keyword}' {relation} {frequency} times in your reply.",
            ),
            _draw_frequency,
            _same,
        ),
        Kind(
            "keywords:letter_frequency",
            6,
            (
                "The letter '{letter}' must appear {let_relation} {let_frequency} times.",
                "Count your letters: '{letter}' should occur {let_relation} {let_frequency} times.",
            ),
            _draw_letters,
            _same,
        ),
    )
}

# Ours, beside IFEval's own table (lm-eval's instructions_registry.INSTRUCTION_CONFLICTS): kinds
# that cannot hold together, or whose transforms undo each other's checks.
LAYOUT = {
    "length_constraints:number_paragraphs",
    "length_constraints:nth_paragraph_first_word",
    "detectable_format:number_bullet_lists",
    "pipeline:numbered_list",
    "detectable_format:multiple_sections",
    "combination:two_responses",
}
CASE = {"change_case:english_lowercase", "change_case:english_capital", "change_case:capital_word_frequency"}
COUNTS = {"pipeline:exact_sentences", "length_constraints:number_sentences", "length_constraints:number_words"}
ADDS = {  # what adds a sentence, a line or a paragraph of its own to the answer
    "detectable_format:title",
    "detectable_content:postscript",
    "startend:end_checker",
    "combination:repeat_prompt",
    "detectable_format:multiple_sections",
    "combination:two_responses",
}
WRAPS = {"startend:quotation", "detectable_format:json_format"}
STARTS = {
    "pipeline:first_word",
    "combination:repeat_prompt",
    "detectable_format:title",
    *WRAPS,
}  # what the text starts with
ENDS = {"startend:end_checker", "detectable_content:postscript", *WRAPS}  # what it ends with
CLIQUES = [LAYOUT, CASE, COUNTS, STARTS, ENDS]  # any two of one conflict
APART = [  # any of the first conflicts with any of the second
    (COUNTS, ADDS | WRAPS),
    ({"length_constraints:nth_paragraph_first_word"}, ADDS | STARTS | ENDS),
    ({"detectable_format:json_format"}, LAYOUT | ADDS | {"detectable_format:number_highlighted_sections"}),
    ({"detectable_format:multiple_sections"}, {"change_case:english_lowercase"}),
    ({"combination:repeat_prompt"}, CASE | {"punctuation:no_comma"}),
    ({"pipeline:one_word"}, set(KINDS) - CASE - {"pipeline:one_word"}),
]


def conflicts(a: str, b: str) -> bool:
    from lm_eval.tasks.ifeval import instructions_registry

    table = instructions_registry.INSTRUCTION_CONFLICTS
    return (
        a == b
        or b in table.get(a, ())
        or a in table.get(b, ())
        or any(a in group and b in group for group in CLIQUES)
        or any((a in x and b in y) or (b in x and a in y) for x, y in APART)
    )


def ifeval_kwargs(kind: Kind, args: dict) -> dict:
    """The arguments IFEval's checker class takes (ours carry more: what to replace, ...)."""
    import inspect

    from lm_eval.tasks.ifeval import instructions_registry

    cls = instructions_registry.INSTRUCTION_DICT[kind.id]
    accepted = inspect.signature(cls.build_description).parameters
    return {k: v for k, v in args.items() if k in accepted}


def follows(kind_id: str, args: dict, answer: str) -> bool:
    """Whether `answer` obeys the instruction: lm-eval's IFEval checker for its kinds, ours else.
    (IFEval's case checkers ask langdetect whether the text is English, which draws at random:
    seeded here, every check of a text gives one answer.)"""
    kind = KINDS[kind_id]
    if not kind.ifeval:
        return kind.check(answer, args)
    import langdetect
    from lm_eval.tasks.ifeval import instructions_registry

    langdetect.DetectorFactory.seed = 0

    checker = instructions_registry.INSTRUCTION_DICT[kind_id](kind_id)
    checker.build_description(**ifeval_kwargs(kind, args))
    return bool(answer.strip()) and checker.check_following(answer)


def phrase(kind: Kind, args: dict, rng: random.Random) -> str:
    """The instruction in one of its phrasings, its arguments filled in."""
    shown = {
        k: (" and ".join(f"'{x}'" for x in v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v)
        for k, v in args.items()
    }
    return rng.choice(kind.phrasings).format(**shown)


def english(text: str) -> bool:
    """Whether a text is English as IFEval's case checkers tell (langdetect, seeded)."""
    import langdetect

    langdetect.DetectorFactory.seed = 0
    try:
        return langdetect.detect(text) == "en"
    except langdetect.LangDetectException:
        return False
