"""Cheap, pure-string answer extraction that runs in the trainer process.

Everything here is linear-time regex/scan work on a bounded slice of the response, so it
is safe to run on untrusted text outside the worker pool. It never parses mathematics:
that happens in worker processes (see ``ggpo_verifiers.equivalence``).

Extraction policy (``final_answer``), first rule that yields an answer wins:

1. ``boxed``: the last ``\\boxed{...}`` (or ``\\fbox{...}``) in the tail of the response,
   with brace matching (escaped ``\\{``/``\\}`` do not count), joined with ``", "`` to the
   boxes chained to it (``box_group``): boxes of one answer (``\\boxed{k = 45} \\quad
   \\text{and} \\quad \\boxed{n = 2}`` is ``k = 45, n = 2``) and hedges
   (``\\boxed{5} if $n$ is even, \\boxed{6} otherwise`` is ``5, 6``, which matches
   neither ``5`` nor ``6``); a box after a sentence or words without a separator is a
   new attempt (``\\boxed{3}. Wait, ... \\boxed{4}`` is ``4``).
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
from fractions import Fraction

from ggpo_verifiers.records import GoldAnswerError

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Two boxes are one answer when the text between them is short (MAX_BOX_GAP), ends no
# sentence, and either names a separator ("\boxed{1}$, $\boxed{2}", "\quad \text{and}
# \quad", "\) and \( y_2 =", "if $n$ is even,") or holds no word at all ("$ $", "++").
# math-verify chains boxes under 70 characters apart that hold a separator, or under 10
# apart whatever they hold (so "\boxed{3} then \boxed{4}" is a set there, 4 here).
MAX_BOX_GAP = 70
_GAP_BREAK_RE = re.compile(r"[.!?](?:\s|$)|\n\s*\n")
_GAP_SEPARATOR_RE = re.compile(r"\b(?:and|or)\b|[,;]")
_GAP_WORD_RE = re.compile(r"(?<!\\)\b[A-Za-z]{2,}")
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


def box_group(text: str) -> tuple[str, int] | None:
    """The final answer given in boxes: the content of the last balanced box, joined with
    ``", "`` to the boxes chained to it (see the module docstring; a box repeating the
    one after it is kept once), and the end of the last box. None without a balanced box.
    Linear in ``len(text)``."""
    boxes = boxed_answers(text)
    if not boxes:
        return None
    parts = [boxes[-1][2]]
    for (_, prev_end, content), (next_start, _, _) in zip(reversed(boxes[:-1]), reversed(boxes[1:])):
        if not _chained(text[prev_end:next_start]):
            break
        if content != parts[-1]:
            parts.append(content)
    return ", ".join(reversed(parts)), boxes[-1][1]


def _chained(gap: str) -> bool:
    """Whether two boxes with ``gap`` between them are parts of one answer."""
    if len(gap) > MAX_BOX_GAP or _GAP_BREAK_RE.search(gap):
        return False
    return bool(_GAP_SEPARATOR_RE.search(gap)) or not _GAP_WORD_RE.search(gap)


def last_boxed(text: str) -> str | None:
    """Content of the final box (joined with the boxes chained to it), or None."""
    group = box_group(text)
    return None if group is None else group[0]


def answer_phrase(text: str) -> str | None:
    """The answer after the last "answer is"/"answer:": its first math segment
    (``$...$``, ``\\(...\\)``) if it starts with one, else a leading number followed by
    words ("12 apples", "12, I think"), else the rest of its sentence."""
    matches = list(_PHRASE_RE.finditer(text))
    return _answer_at(text[matches[-1].end() :]) if matches else None


def _answer_at(rest: str) -> str | None:
    """The answer that ``rest`` (the text after an answer phrase) starts with, as
    ``answer_phrase`` reads it."""
    rest = rest.lstrip(" *")
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


FINAL_ANSWER_RE = re.compile(r"(?i)\bfinal answer.{0,100}?\s+is\b\s*:?\s*(?=\$|\\[(\[]|-?\.?\d)")
"""math-verify's "final answer is" phrase (its highest-priority extraction rule), when a
math environment or a number follows it ("the final answer is correct" is no answer).
After the last box it overrides the box: "\\boxed{200} ... The final answer is $10,455$"."""
_GSM8K_RE = re.compile(r"####[ \t]*([^\n]*)")
# The brace-less box "\boxed 5": its argument runs to the next space, brace, dollar or
# command (TeX would box one token; datasets writing "\boxed 42" mean 42).
_BARE_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*([^\s${}\\]+)")


def last_box(text: str) -> tuple[str, int] | None:
    """The final boxed answer of ``text`` and the end of its box: ``box_group``'s, or a
    brace-less ``\\boxed 5`` after it (``5``; a full stop, comma, colon or semicolon
    ending the sentence is not part of it). None without either."""
    group = box_group(text)
    bare = list(_BARE_BOX_RE.finditer(text, group[1] if group else 0))
    if bare and (answer := bare[-1].group(1).rstrip(".,;:")):
        return answer, bare[-1].end()
    return group


def gold_from_solution(text: str, *, solution: bool = False) -> str:
    """The gold answer in ``text``, a dataset's gold field: a bare answer, or a whole
    solution that marks its final answer (MATH, NuminaMath, GSM8K, Minerva styles).

    Returned, first rule that applies:

    1. after the last box, a "final answer is ..." phrase (Minerva: "Final Answer: The
       final answer is $28\\%$. I hope it is correct."): its answer, as ``answer_phrase``
       reads it;
    2. the last box with the boxes chained to it, as for responses (``box_group``):
       ``... so $n = \\boxed{1,-2}$.`` gives ``1,-2``; ``\\fbox{}`` alike; a brace-less
       ``\\boxed 5`` after it (``last_box``) gives ``5``;
    3. GSM8K's ``#### 72``: the rest of the last ``####`` line (as written: ``1,000``
       stays, the verifiers read it as 1000);
    4. otherwise ``text`` itself (a bare answer; whether it parses is the verifier's
       ``check_gold``), stripped; but with ``solution=True`` (the field is a worked
       solution: MATH's ``solution``, GSM8K's ``answer``) a text marking no answer
       states no gold, and is refused.

    Raises ``GoldAnswerError`` when the marked answer is empty, the last ``\\boxed{`` is
    never closed, or ``solution`` is set and nothing marks the answer: the row is broken,
    and guessing where its answer ends could reward wrong responses (or score every
    response 0). Pure string work, linear in ``len(text)``; data loaders call it once per
    row (``ggpo data convert`` too), verifiers call it on every gold.
    """
    box = last_box(text)
    after_box = box[1] if box else 0
    phrases = list(FINAL_ANSWER_RE.finditer(text, after_box))
    unclosed = _BOX_RE.search(text, after_box)
    if phrases:
        answer, marker = _answer_at(text[phrases[-1].end() :]) or "", "'final answer is'"
    elif unclosed is not None:
        raise GoldAnswerError(text, "its last \\boxed{ is never closed; fix the row")
    elif box is not None:
        answer, marker = box[0], "\\boxed{}"
    elif gsm8k := list(_GSM8K_RE.finditer(text)):
        answer, marker = gsm8k[-1].group(1), "'####'"
    elif solution:
        raise GoldAnswerError(text, "the solution marks no final answer (\\boxed{}, \\fbox{}, '#### ' "
                                    "or 'the final answer is')")
    else:
        answer, marker = text, ""
    answer = answer.strip()
    if not answer:
        raise GoldAnswerError(text, f"its final answer ({marker}) is empty" if marker else "it is empty")
    return answer


# Five words in a row outside \text{...} and not LaTeX commands: a sentence.
_PROSE_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?:[ ,;:'-]+[A-Za-z]{2,}){4,}")
_TEXT_GROUP_RE = re.compile(r"\\(?:text|mbox|mathrm|textbf)\s*\{[^{}]*\}")


def reads_as_prose(text: str) -> bool:
    """Whether ``text`` holds a sentence (five words in a row outside ``\\text{}``): a
    solution or explanation rather than a math answer. Linear regex work."""
    return _PROSE_RE.search(_TEXT_GROUP_RE.sub(" ", text)) is not None


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


DEFAULT_REL_TOL = 5e-6
"""Relative tolerance of the ``math`` and ``numeric`` verifiers for numbers written as
decimals (their ``rel_tol``): a decimal rounded to 6 significant digits is within it of
the exact value (0.333333 of 1/3), one rounded to 5 is not (0.33333)."""
MAX_EXACT_BITS = 4096
"""Exact values (``exact_power``, ``equivalence.exact_value``) are computed only while
their numerator and denominator fit in this many bits (10^{300} needs 997, 2^{-1000}
1001): a larger number is never computed, so ``9^{999999999}`` costs nothing."""


def bounded(value: Fraction) -> Fraction | None:
    """``value``, or None when its numerator or denominator exceeds ``MAX_EXACT_BITS``."""
    return value if max(value.numerator.bit_length(), value.denominator.bit_length()) <= MAX_EXACT_BITS else None


def exact_power(base: Fraction, power: int) -> Fraction | None:
    """``base ** power`` exactly, or None when it is undefined (0 to a negative power) or
    would exceed ``MAX_EXACT_BITS`` (checked before computing it)."""
    if base == 0 and power < 0:
        return None
    if max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(power) > MAX_EXACT_BITS:
        return None
    return base**power


_THOUSANDS_GROUP_RE = re.compile(r"(?<=\d)(?:\{,\}|\\[,!; ]|\\thinspace\s*)(?=\d{3}(?!\d))")
# A lone number grouped in threes by commas or by spaces (some locales), one separator
# throughout: "10,455", "1 000 000". Not "3,5" (a list), not "1, 000" (mixed).
_GROUPED_NUMBER_RE = re.compile(r"-?\d{1,3}([, ])\d{3}(?:\1\d{3})*(?:\.\d+)?")
_MATH_DELIMITERS = (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"))
_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")


def normalize_latex_answer(answer: str) -> str:
    """Normalize an answer (or gold) string before it is parsed as LaTeX.

    Number-format policy (``plain_numbers``): digit grouping written ``1{,}000``, ``1\\,000`` or ``1\\!000``
    is removed; a plain comma or space is a thousands separator only when the whole
    answer is one number with 3-digit groups and one kind of separator (``1,000`` =
    1000, ``12,345.5`` = 12345.5, ``10 455`` = 10455);
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
    text = plain_numbers(text)
    if grouped := _GROUPED_NUMBER_RE.fullmatch(text):
        text = text.replace(grouped[1], "")
    text = _REPEATING_RE.sub(_repeating_decimal_as_fraction, text)
    return text.replace("\\varnothing", "\\emptyset")


def plain_numbers(text: str) -> str:
    """``text`` with LaTeX digit grouping removed (``10\\,455``, ``1{,}000``: the LaTeX
    parser reads ``10\\,455`` as a product) and ``\\mathrm{e}`` (Euler's number, upright
    as ISO writes it) as ``e`` (the parser stops at ``\\mathrm{e}``). For answers and for
    whole responses without a box."""
    return _THOUSANDS_GROUP_RE.sub("", text.replace("\\mathrm{e}", "e"))


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
