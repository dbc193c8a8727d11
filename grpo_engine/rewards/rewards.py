"""Rule-based rewards: small pure functions returning ``(total, components)``.

The verifier plays the outcome reward model's part (paper 4.1.2): it knows the reference answer.
The process reward model's part (4.1.3) on the built-in task is played by builtin_task.check_step,
which reads and compares a solution's final answer line with this module's functions.

Final answers are read from a completion in two forms (:func:`extract_final_answer`): a GSM8K
``#### <answer>`` last line, or the last ``\\boxed{...}``. That is the 'strict' rule; the 'flexible' one
(RunSpec.answer_match, :func:`final_answer`) also takes the last number of a completion that states no answer
so (:func:`last_number`, lm-eval's GSM8K "flexible-extract"). Two answers are compared as mathematics,
not as strings (:func:`answers_match`): plain numbers in pure Python, anything else with
Hugging Face's math-verify (imported only when needed, so the web process stays light).
Pure Python: no torch.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

ANSWER_PREFIX = "#### "  # a GSM8K solution's last line: this prefix, then the final answer

MATH_VERIFY_TIMEOUT_S = 2  # math-verify's limit (whole seconds, signal.alarm) per parse and per comparison
MAX_ANSWER_CHARS = 300  # a predicted final answer longer than this is not compared (counts as wrong)
DECIMAL_REL_TOL = 1e-9  # plain decimals are equal when within this relative tolerance


# ---- final answers ------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LATEX_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_MATH_WORDS = {"sqrt", "pi", "inf", "oo", "sin", "cos", "tan", "log", "ln", "exp", "mod"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    return lines[-1] if lines else ""


def _stated_after_hashes(line: str) -> str | None:
    """What a ``####`` line states: its text after the ``####``, with any further leading ``#`` and white space
    stripped; None when the line does not start with ``####``, or when that text holds no letter or digit (a line
    of hashes, ``#### .``): such a line states no answer.

    >>> _stated_after_hashes("#### 14"), _stated_after_hashes("######## 3"), _stated_after_hashes("####x = 3")
    ('14', '3', 'x = 3')
    >>> _stated_after_hashes("########"), _stated_after_hashes("#### ."), _stated_after_hashes("so 14")
    (None, None, None)
    """
    prefix = ANSWER_PREFIX.strip()
    if not line.startswith(prefix):
        return None
    stated = line[len(prefix) :].lstrip("#").strip()
    return stated if any(ch.isalnum() for ch in stated) else None


def _is_expression(answer: str) -> bool:
    """Could ``answer`` (what follows ``####``) be a number or a formula, rather than prose?

    LaTeX commands and ``\\text{..}`` groups are allowed; a word of two or more letters that is not
    a function name (``sqrt``, ``pi``, ...) makes it prose: ``14 apples`` is no answer, ``x=3`` is.
    """
    if not answer:
        return False
    bare = _LATEX_COMMAND_RE.sub(" ", _LATEX_TEXT_RE.sub(" ", answer))
    return all(word.lower() in _MATH_WORDS for word in _WORD_RE.findall(bare))


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None when
    there is none, when the last one is never closed (a cut-off output), or when it is empty."""
    openings = list(_BOX_RE.finditer(text))
    if not openings:
        return None
    start = openings[-1].end()  # just after the "{"
    depth, i = 1, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # \{ and \} are literal braces (a set), not grouping
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                content = text[start:i].strip()
                return content or None
        i += 1
    return None


def extract_final_answer(completion: str) -> tuple[str | None, str]:
    """The completion's final answer and the form it was found in.

    1. ``"gsm8k"``: the last non-empty line is ``#### <answer>`` (GSM8K style, as the built-in task
       writes it), where the answer is a number or an expression, not prose (``#### 14 apples`` is
       not an answer). Text after that line means there is no such answer. The answer is what follows the
       ``####`` once any further leading ``#`` and white space are stripped (``######## 3`` states 3); a line
       whose rest holds no letter or digit (``########``, ``#### .``) states no answer, so the rule goes on to
       2., and under 'flexible' (:func:`final_answer`) to the last number.
    2. ``"boxed"``: otherwise, the content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` anywhere,
       braces balanced (nested ``\\frac{1}{2}`` and escaped ``\\{1,2\\}`` are fine). An unclosed or
       empty last box gives no answer: an earlier box is not taken instead.
    3. ``"none"``: no final answer; returns ``(None, "none")``.

    >>> extract_final_answer("3*4=12\\n2+12=14\\n#### 14")
    ('14', 'gsm8k')
    >>> extract_final_answer("so $x = \\\\boxed{\\\\frac{1}{2}}$.")
    ('\\\\frac{1}{2}', 'boxed')
    >>> extract_final_answer("= 3 stickers left.\\n######## 3"), extract_final_answer("3 left.\\n########")
    (('3', 'gsm8k'), (None, 'none'))
    >>> extract_final_answer("3 left.\\n#### ."), extract_final_answer("######## Eva has 3 stickers left")
    ((None, 'none'), (None, 'none'))
    """
    answer = _stated_after_hashes(_last_line(completion))
    if answer is not None and _is_expression(answer):
        return answer, "gsm8k"
    boxed = _last_boxed(completion)
    if boxed is not None:
        return boxed, "boxed"
    return None, "none"


def _reference_final_answer(reference: str) -> str:
    """The answer in a reference: the ``####`` line's text or the last box when it is a whole
    solution (GSM8K, MATH), else the reference itself. References are trusted: no prose test. Its ``####`` line is
    read as an output's (:func:`_stated_after_hashes`: further leading ``#`` stripped; a line with no letter or
    digit after them states nothing).

    >>> [_reference_final_answer(r) for r in ("4 + 4 = 8\\n#### 8", "######## 8", "8")]
    ['8', '8', '8']
    """
    stated = _stated_after_hashes(_last_line(reference))
    if stated is not None:
        return stated
    boxed = _last_boxed(reference)
    return boxed if boxed is not None else reference.strip()


# lm-eval's GSM8K "flexible-extract" regex: a signed run of two or more of $ digits . , or a signed integer
_FLEXIBLE_NUMBER_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
STRICT_FORMS = ("gsm8k", "boxed")  # the forms of a final answer stated as the strict rule reads it
MATCH_RULES = ("strict", "flexible")  # RunSpec.answer_match's values, as final_answer reads them
# each form final_answer gives, as the dashboard names the rule that read the answer (recorded as samples.answer_rule)
FORM_WORDS = {
    "gsm8k": "strict ####",
    "boxed": "strict \\boxed{}",
    "number": "flexible last number",
    "none": "none",
}


def last_number(text: str) -> str | None:
    """The last number of ``text`` as lm-eval's GSM8K "flexible-extract" reads it: the last match of the regex
    ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, with ``$`` and ``,`` taken out and a trailing ``.`` cut. A match without a
    digit (an ellipsis ``...``, ``$,``) is no number: the one before it counts. None when there is none.

    >>> last_number("so she has 3 + 5 = 8 apples."), last_number("It costs $1,000.")
    ('8', '1000')
    >>> last_number("It fell to -4 degrees..."), last_number("no digits here") is None
    ('-4', True)
    """
    for match in reversed(list(_FLEXIBLE_NUMBER_RE.finditer(text))):
        number = match.group().replace("$", "").replace(",", "")
        number = number[:-1] if number.endswith(".") else number
        if any(ch.isdigit() for ch in number):
            return number
    return None


def final_answer(completion: str, match: str = "strict") -> tuple[str | None, str]:
    """The completion's final answer under the rule ``match`` (RunSpec.answer_match) and the form it was found in.

    'strict': :func:`extract_final_answer` (forms ``"gsm8k"``, ``"boxed"``, ``"none"``). 'flexible': that answer
    when there is one, else the completion's last number (:func:`last_number`, form ``"number"``), so an
    instruct model's answer in prose counts; ``(None, "none")`` when it holds no number either.

    >>> final_answer("so she has 3 + 5 = 8 apples.", "flexible"), final_answer("so she has 3 + 5 = 8 apples.")
    (('8', 'number'), (None, 'none'))
    >>> final_answer("5 + 9 = 14, not 15\\n#### 14", "flexible"), final_answer("\\\\boxed{14}, not 15", "flexible")
    (('14', 'gsm8k'), ('14', 'boxed'))
    """
    if match not in MATCH_RULES:
        raise ValueError(f"answer match must be one of {', '.join(MATCH_RULES)}, got {match!r}")
    answer, form = extract_final_answer(completion)
    if answer is not None or match == "strict":
        return answer, form
    number = last_number(completion)
    return (number, "number") if number is not None else (None, "none")


# ---- comparing two answers ------------------------------------------------------------------------

_PLAIN_NUMBER_RE = re.compile(r"([+-]?)\s*(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d*))?")
_TIMES_RE = re.compile(r"\\times|\\cdot|\\ast|[×·]")
_ARITHMETIC_RE = re.compile(r"[\d.+\-*/()]+")  # digits, + - * / and brackets only
_BINARY_OPERATOR_RE = re.compile(r"[\d.)][+\-*]")  # an operator after an operand: not a sign
_COSTLY_RES = (
    re.compile(r"\^\s*\{[^{}]*\^"),  # a tower of powers: 9^{9^{9}}
    re.compile(r"\^\s*\(?\s*\d+\s*\)?\s*\^"),  # 9^9^9
    re.compile(r"\^\s*[{(]?\s*\d{7,}"),  # an exponent of a million or more
    re.compile(r"\d{6,}\s*!"),  # the factorial of a hundred thousand or more
)
_MAX_NESTING = 12


def plain_number(text: str) -> Fraction | None:
    """``text`` as an exact number when it is a plain one: sign, digits (``1,000`` separators),
    decimals, surrounding ``$``; else None. ``- 3``, ``$1,000``, ``14.0``, ``14.`` are plain.
    >>> plain_number("$1,000")
    Fraction(1000, 1)
    >>> plain_number("2+12") is None
    True
    """
    s = text.replace("\\$", "$").strip().strip("$").strip()
    match = _PLAIN_NUMBER_RE.fullmatch(s)
    if not match or not (match.group(2) or match.group(3)):
        return None
    sign, whole, frac = match.groups()
    return Fraction(f"{sign}{(whole or '0').replace(',', '')}.{frac or '0'}")


def _numbers_equal(a: Fraction, b: Fraction) -> bool:
    if a.denominator == 1 and b.denominator == 1:
        return a == b  # integers: exact, however large
    return abs(a - b) <= DECIMAL_REL_TOL * max(abs(a), abs(b))


def _unevaluated(predicted: str) -> bool:
    """Is the answer (its value after the last ``=``) an unevaluated computation of plain numbers,
    such as ``2+3*4`` or ``12 \\cdot 2``? Such an answer is never right: on the built-in task it is
    the question itself, and math-verify would find it equal to the result. A fraction ``1/2`` or a
    signed number ``- 3`` is not a computation."""
    value = "".join(_TIMES_RE.sub("*", predicted.rsplit("=", 1)[-1].replace("$", "")).split())
    return _ARITHMETIC_RE.fullmatch(value) is not None and _BINARY_OPERATOR_RE.search(value) is not None  # has a digit


def _costly(predicted: str) -> bool:
    """Could comparing this answer make sympy run for very long (a huge power or factorial, deep
    nesting, a very long answer)? Those answers count as wrong without being compared; this matters
    most off the main thread, where math-verify has no timeout."""
    if len(predicted) > MAX_ANSWER_CHARS:
        return True
    text = predicted.replace("**", "^")
    if any(pattern.search(text) for pattern in _COSTLY_RES):
        return True
    depth = deepest = 0
    for ch in text:
        depth += ch in "({["
        depth -= ch in ")}]"
        deepest = max(deepest, depth)
    return deepest > _MAX_NESTING


def _as_math(answer: str) -> str:
    """An extracted answer as one inline LaTeX formula, the form math-verify's LaTeX extraction
    finds (it looks for ``$..$``, ``\\(..\\)``, ``\\boxed{}``, not bare text)."""
    body = re.sub(r"(?<!\\)\$", "", answer).replace("\n", " ").strip()
    return f"${body}$"


def _math_verify_equal(predicted: str, reference: str) -> bool:
    """math-verify's judgement: is ``predicted`` mathematically the ``reference``?

    math-verify limits each parse and each comparison with ``signal.alarm``, which only the main
    thread may use (elsewhere it raises ValueError): on the main thread (the trainer in a Celery
    ``--pool=solo`` worker, tests) the limit is ``MATH_VERIFY_TIMEOUT_S``; on any other thread it
    runs with no limit (``parsing_timeout=None``, ``timeout_seconds=None``), and :func:`_costly`
    is what keeps it short. Note ``signal.alarm`` cancels any alarm the caller had set.
    An error or a timeout inside math-verify means "not equal".
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    limit = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    try:
        gold = parse(_as_math(reference), extraction_config=config, parsing_timeout=limit)
        target = parse(_as_math(predicted), extraction_config=config, parsing_timeout=limit)
        if not gold or not target:
            return False
        return bool(verify(gold, target, timeout_seconds=limit))  # gold first: verify is not symmetric
    # any failure means not equal; math-verify's TimeoutException is a BaseException, not an Exception
    except (Exception, TimeoutException):  # noqa: BLE001
        return False


def answers_match(predicted: str, reference: str) -> bool:
    """Is ``predicted`` the same answer as ``reference``, mathematically?

    1. Both plain numbers (``14``, ``-3``, ``- 3``, ``1,000``, ``14.0``, ``$18``): compared as
       numbers, exactly for integers, within ``DECIMAL_REL_TOL`` (relative) for decimals. Pure
       Python, no sympy: the built-in task's answers take this path.
    2. A predicted unevaluated computation (``2+3*4``, ``x=7-2``) or an answer too costly to
       compare (:func:`_costly`): not equal.
    3. Otherwise math-verify parses both as LaTeX / plain expressions and compares them symbolically
       and numerically: ``\\frac{1}{2}`` = ``1/2`` = ``0.5`` = ``\\dfrac12``, ``2\\sqrt{2}`` =
       ``\\sqrt{8}``, intervals, sets (order-free), ``\\text{cm}`` units ignored. Its rules decide two
       cases: a percentage matches both readings (``50\\%`` = ``50`` = ``0.5``), and a one-variable
       assignment counts as its value (``x=3`` = ``3``; an equation's last right-hand side is taken
       when the reference is not an equation). Its decimals are compared to 6 places.
    Never raises on any input (math-verify's errors and timeouts count as not equal).
    """
    a, b = plain_number(predicted), plain_number(reference)
    if a is not None and b is not None:
        return _numbers_equal(a, b)
    if not predicted.strip() or not reference.strip() or _costly(predicted) or _unevaluated(predicted):
        return False
    return _math_verify_equal(predicted, reference)


def outcome_reward(
    completion: str, reference_answer: str, format_weight: float = 0.0, match: str = "strict"
) -> tuple[float, dict[str, float]]:
    """The verifier: 1.0 when the final answer equals the reference, else 0.0, plus a format reward.

    total = correct + format_weight * formatted. Components: ``correct`` (the final answer under the rule
    ``match``, :func:`final_answer`, matches: :func:`answers_match`), ``formatted`` (a final answer is stated in
    the strict form, ``####`` line or ``\\boxed{}``, :func:`extract_final_answer`, whatever ``match`` is) and,
    only when ``format_weight > 0``, ``format`` (its share of the total). The reference may be a bare answer or
    a whole GSM8K / MATH solution (its ``####`` line or its last box is the answer).

    >>> outcome_reward("so she has 3 + 5 = 8 apples.", "8", match="flexible")
    (1.0, {'correct': 1.0, 'formatted': 0.0})
    >>> outcome_reward("so she has 3 + 5 = 8 apples.", "8", format_weight=0.5)
    (0.0, {'correct': 0.0, 'formatted': 0.0, 'format': 0.0})
    >>> outcome_reward("3 + 5 = 8\\n#### 8", "8", format_weight=0.5, match="flexible")
    (1.5, {'correct': 1.0, 'formatted': 1.0, 'format': 0.5})
    """
    return reading_reward(final_answer(completion, match), reference_answer, format_weight)


def reading_reward(
    reading: tuple[str | None, str], reference_answer: str, format_weight: float = 0.0
) -> tuple[float, dict[str, float]]:
    """:func:`outcome_reward` of an output whose final answer was read already: ``reading`` is
    :func:`final_answer`'s (answer, form), so the engine reads each output once and records that reading beside
    its reward.

    >>> reading_reward(("8", "number"), "4 + 4 = 8\\n#### 8", 0.5), reading_reward((None, "none"), "8")
    ((1.0, {'correct': 1.0, 'formatted': 0.0, 'format': 0.0}), (0.0, {'correct': 0.0, 'formatted': 0.0}))
    """
    answer, form = reading
    correct = float(answer is not None and answers_match(answer, _reference_final_answer(reference_answer)))
    formatted = float(form in STRICT_FORMS)
    components = {"correct": correct, "formatted": formatted}
    total = correct
    if format_weight > 0:
        components["format"] = format_weight * formatted
        total += components["format"]
    return total, components
