"""Cheap, pure-string answer extraction that runs in the trainer process.

Everything here is linear-time regex/scan work on a bounded slice of the response, so it
is safe to run on untrusted text outside the worker pool. It never parses mathematics:
that happens in worker processes (see ``ggpo_verifiers.equivalence``).

Extraction policy (``final_answer``), first rule that yields an answer wins:

1. ``boxed``: the last ``\\boxed{...}`` (or ``\\fbox{...}``) in the tail of the response,
   with brace matching (escaped ``\\{``/``\\}`` do not count). Boxes that directly precede
   it, separated only by ``,``/``and``/``or``/``$``/whitespace, are part of the same answer
   and joined with ``", "``: ``\\boxed{3} or \\boxed{4}`` is the hedged answer ``3, 4``
   (which matches neither ``3`` nor ``4``), ``\\boxed{1}, \\boxed{2}`` is ``1, 2``.
2. ``answer_phrase`` (fallback): after the last "answer is", "answer:" or "answer =":
   its first math segment (``$...$``), else a leading number followed by words
   ("12 apples" is 12; "1 + x" is not 1), else the rest of the sentence.
3. ``last_number`` (fallback): the last number (``-12``, ``3.5``, ``1,000``, ``3/4``)
   that is not inside a LaTeX expression: a number in braces or next to ``^``, ``_``,
   ``!`` or a command (the ``2`` of ``\\frac{1+\\sqrt{5}}{2}``, the ``3`` of ``x^3``, the
   ``13`` of ``\\frac13``) is never taken. (Numbers next to ``+-*/`` still are: plain
   arithmetic such as ``17+25=42`` reads as before.)

The ``math`` verifier does not use ``final_answer``'s fallbacks in this process: for a
response without a box it sends ``UNBOXED`` + ``unboxed_text(...)`` to its worker, which
extracts the answer there (see ``ggpo_verifiers.equivalence.find_answer``).

An answer longer than ``max_chars`` or nested deeper than ``max_depth`` brackets is
rejected (returned as ``None``, i.e. unparseable) before any parser sees it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# What may separate two boxes that form one answer: "\boxed{1}$, $\boxed{2}", "... or ...".
_BOX_JOIN_RE = re.compile(r"^[\s$]*(?:,|;|\band\b|\bor\b|,\s*and\b|,\s*or\b)?[\s$]*$")
_PHRASE_RE = re.compile(r"(?i)\b(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)")
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)|\n")
_LEADING_MATH_RE = re.compile(r"\$([^$]+)\$|\\\((.+?)\\\)")
# A number followed only by the end, punctuation or a word ("12 apples", "12, I think"):
# not by an operator ("1 + x" is not 1) nor glued to a variable ("12x").
_LEADING_NUMBER_RE = re.compile(
    r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*\\?%)?(?=\s*$|\s*[,;:!?.]|\s+[A-Za-z])"
)
_REPEATING_RE = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
# Context that puts a number inside a LaTeX expression: right after "^", "_", "{" or a
# command ("\frac13", "\sqrt 3", "\sqrt[3]"), or right before "^", "_", "!" or a brace.
_LATEX_BEFORE_RE = re.compile(r"(?:[\^_{]|\\[A-Za-z]+\s*\[?)\s*$")
_LATEX_AFTER_RE = re.compile(r"\s*[\^_{}!]")
# An operator with an operand on the number's other side ("x + 3", "2 * 3", "1 + x"); a
# word is no operand before it ("is -5").
_OPERATOR_BEFORE_RE = re.compile(r"(?:(?<![A-Za-z\\])[A-Za-z]|\\[A-Za-z]+|[\d)}])\s*[-+*/×÷]\s*$")
_OPERATOR_AFTER_RE = re.compile(r"\s*[-+*/×÷]\s*[\w\\({]")
_OPENERS = "{[("
_CLOSERS = "}])"
# A backslash escapes the next character (\{ is a literal brace, \\ a line break).
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)


def brace_pairs(text: str) -> dict[int, int]:
    """Map the index of every balanced ``{`` in ``text`` to the index of its ``}``.

    One linear pass. LaTeX-escaped braces (``\\{``, ``\\}``) are literal characters,
    not grouping; unbalanced braces are left out.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKEN_RE.finditer(text):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            pairs[stack.pop()] = token.start()
    return pairs


def boxed_answers(text: str) -> list[tuple[int, int, str]]:
    """All balanced ``\\boxed{...}``/``\\fbox{...}`` as (start, end, content), in order.

    Nested boxes are reported only as part of their outer box; an unbalanced box is
    skipped.
    """
    pairs = brace_pairs(text)
    boxes: list[tuple[int, int, str]] = []
    for match in _BOX_RE.finditer(text):
        close = pairs.get(match.end() - 1)
        if close is None or (boxes and match.start() < boxes[-1][1]):
            continue
        boxes.append((match.start(), close + 1, text[match.end() : close]))
    return boxes


def last_boxed(text: str) -> str | None:
    """Content of the final box (joined with the boxes chained to it), or None."""
    boxes = boxed_answers(text)
    if not boxes:
        return None
    parts = [boxes[-1][2]]
    for (_, prev_end, content), (next_start, _, _) in zip(
        reversed(boxes[:-1]), reversed(boxes[1:])
    ):
        if not _BOX_JOIN_RE.match(text[prev_end:next_start]):
            break
        parts.append(content)
    return ", ".join(reversed(parts))


def answer_phrase(text: str) -> str | None:
    """The answer after the last "answer is"/"answer:": its first math segment
    (``$...$``, ``\\(...\\)``) if it starts with one, else a leading number followed by
    words ("12 apples", "12, I think"), else the rest of its sentence."""
    matches = list(_PHRASE_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :].lstrip(" *")
    math_segment = _LEADING_MATH_RE.match(rest)
    if math_segment:
        return math_segment.group(1) or math_segment.group(2)
    end = _SENTENCE_END_RE.search(rest)
    sentence = (rest[: end.start()] if end else rest).strip().strip("*").strip()
    number = _LEADING_NUMBER_RE.match(sentence)
    if number:
        return number.group().rstrip(",").strip()
    return sentence or None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (integer, decimal, ``1,000`` grouping or ``a/b``) that
    is not inside a LaTeX expression (see ``inside_latex``)."""
    for match in reversed(list(_NUMBER_RE.finditer(text))):
        if not inside_latex(text, match.start(), match.end()):
            return match.group()
    return None


def inside_latex(text: str, start: int, end: int) -> bool:
    """Whether the number ``text[start:end]`` is inside a LaTeX expression: it follows
    ``^``, ``_``, ``{`` or a command (``x^3``, ``a_{3}``, ``\\frac13``, ``\\sqrt 3``,
    ``\\sqrt[3]{8}``) or precedes ``^``, ``_``, ``!`` or a brace (``10^{3}``, ``5!``).
    Looks at 40 characters before the number: bounded work."""
    return bool(_LATEX_BEFORE_RE.search(text, max(0, start - 40), start) or _LATEX_AFTER_RE.match(text, end))


def part_of_expression(text: str, start: int, end: int) -> bool:
    """Whether the number ``text[start:end]`` is part of a larger expression, so that
    taking it alone would be a guess: ``inside_latex``, or next to an operator with an
    operand on its other side (``x + 3``, ``x - 3``, ``2 * 3``, ``1 + x``; not ``is -5``:
    a leading minus sign counts as an operator, a word as no operand). Looks at 40
    characters on each side: bounded work."""
    if inside_latex(text, start, end):
        return True
    if text.startswith("-", start):
        start += 1
    return bool(
        _OPERATOR_BEFORE_RE.search(text, max(0, start - 40), start)
        or _OPERATOR_AFTER_RE.match(text, end, end + 40)
    )


MATH_VERIFY = "math_verify"
"""Name of the ``math`` verifier's fallback rule that runs math-verify's extraction in
the worker (``ggpo_verifiers.equivalence.math_verify_answer``)."""

UNBOXED = "\n[unboxed]\n"
"""Prefix of an extracted "answer" that is response text without a box, whose answer
the worker extracts. A box's content is stripped, so it never starts with a line break."""


def has_box(text: str) -> bool:
    """Whether ``text`` holds a balanced ``\\boxed{...}``/``\\fbox{...}``."""
    return _BOX_RE.search(text) is not None and bool(boxed_answers(text))


def unboxed_text(text: str, max_chars: int) -> str:
    """The last ``max_chars`` characters of ``text``, starting after a line break (or
    else a space) when the cut falls inside the text: a cut mid-line could split a
    ``$...$`` pair and pair the wrong dollars."""
    if len(text) <= max_chars:
        return text
    tail = text[-max_chars:]
    for boundary in ("\n", " "):
        cut = tail.find(boundary)
        if cut != -1:
            return tail[cut + 1 :]
    return tail


def nesting_depth(text: str) -> int:
    """Maximum nesting of ``{[(`` brackets (escaped braces count too: they nest in sets)."""
    depth = deepest = 0
    for ch in text:
        if ch in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in _CLOSERS:
            depth = max(depth - 1, 0)
    return deepest


FALLBACK_RULES = {"answer_phrase": answer_phrase, "last_number": last_number}
"""The optional fallback extraction rules by name."""
FALLBACKS = tuple(FALLBACK_RULES)
"""Default fallbacks: all of them, in this order."""


def checked_fallbacks(fallbacks: Sequence[str], known: Sequence[str] = FALLBACKS) -> tuple[str, ...]:
    """``fallbacks`` as a tuple; ValueError naming the rules not in ``known`` if any."""
    unknown = set(fallbacks) - set(known)
    if unknown:
        raise ValueError(f"fallbacks={list(fallbacks)!r}: unknown {sorted(unknown)}; choose from {list(known)}")
    return tuple(fallbacks)


def final_answer(
    response: str,
    fallbacks: Sequence[str] = FALLBACKS,
    tail_chars: int = 4000,
    max_chars: int = 1000,
    max_depth: int = 32,
) -> str | None:
    """The final answer of ``response`` by the policy in the module docstring, or None.

    Only the last ``tail_chars`` characters are searched: final answers come last, and
    this bounds the work on megabyte-long responses.
    """
    tail = response[-tail_chars:]
    answer = last_boxed(tail)
    for rule in fallbacks:
        if answer is not None:
            break
        answer = FALLBACK_RULES[rule](tail)
    if answer is None:
        return None
    answer = answer.strip()
    if not answer or len(answer) > max_chars or nesting_depth(answer) > max_depth:
        return None
    return answer


_THOUSANDS_GROUP_RE = re.compile(r"(?<=\d)(?:\{,\}|\\[,!; ]|\\thinspace\s*)(?=\d{3}(?!\d))")
_COMMA_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_MATH_DELIMITERS = (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"))
_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")


def normalize_latex_answer(answer: str) -> str:
    """Normalize an answer (or gold) string before it is parsed as LaTeX.

    Number-format policy: digit grouping written ``1{,}000``, ``1\\,000`` or ``1\\!000``
    is removed; a plain comma is a thousands separator only when the whole answer is
    one number with 3-digit groups (``1,000`` = 1000, ``12,345.5`` = 12345.5);
    otherwise commas separate list elements (``1,5`` is the list 1, 5, not 1.5).
    A repeating decimal ``0.\\overline{3}`` becomes the exact fraction. Math-mode
    delimiters (``$``, ``\\(...\\)``, ``\\[...\\]``), line breaks, a trailing full stop and
    ``\\varnothing`` (spelled ``\\emptyset``) are normalized away.
    """
    text = " ".join(answer.split())
    for left, right in _MATH_DELIMITERS:
        if text.startswith(left) and text.endswith(right) and len(text) >= len(left + right):
            text = text[len(left) : len(text) - len(right)].strip()
    text = _UNESCAPED_DOLLAR_RE.sub("", text).strip()
    text = text.rstrip(".").strip()
    text = _THOUSANDS_GROUP_RE.sub("", text)
    if _COMMA_NUMBER_RE.fullmatch(text):
        text = text.replace(",", "")
    text = _REPEATING_RE.sub(_repeating_decimal_as_fraction, text)
    return text.replace("\\varnothing", "\\emptyset")


def _repeating_decimal_as_fraction(match: re.Match[str]) -> str:
    """``0.1\\overline{6}`` as the exact fraction ``\\frac{15}{90}`` (integer arithmetic on
    digit strings of a length-capped answer: cheap)."""
    sign, whole, fixed, repeated = match.groups()
    denominator = 10 ** len(fixed) * (10 ** len(repeated) - 1)
    numerator = int(whole or "0") * denominator + int(fixed + repeated) - int(fixed or "0")
    return f"{sign}\\frac{{{numerator}}}{{{denominator}}}"


def container_kind(answer: str) -> str | None:
    """``"set"`` for ``\\{...\\}``, ``"sequence"`` for one bracketed ``(...)``/``[...]``
    (tuple or interval), else None. Used to keep ``\\{1,2\\}`` apart from ``(1,2)``:
    math-verify alone reads a set and an open interval with the same ends as equal.
    """
    text = answer.replace("\\left", "").replace("\\right", "").replace(" ", "")
    text = text.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    if text.startswith("\\{") and text.endswith("\\}"):
        return "set"
    if text[:1] in "([" and text[-1:] in ")]":
        depth = 0
        for i, ch in enumerate(text):
            depth += ch in "([" 
            depth -= ch in ")]"
            if depth == 0:
                return "sequence" if i == len(text) - 1 else None
    return None
