r"""Does every checkable equation in one reasoning step hold? An exact arithmetic step checker, pure Python.

:func:`step_equations_hold` reads one step of a math solution (prose, GSM8K calculator annotations, LaTeX)
and checks every ``=`` it can, in exact rational arithmetic (:class:`fractions.Fraction`, never floats), so
``1/3 + 1/3 = 2/3`` and ``0.1 + 0.2 = 0.3`` hold.

What counts as an equation: each ``=`` (or ``==``) is one link between the arithmetic written next to it,
the maximal expression on each side: numbers (``1,250``, ``2.5``, ``.5``, ``$12``, ``25%`` = 1/4), the
operators ``+ - * / ^ **`` and ``× · ÷`` (``x`` too, between two spaced numbers: ``3 x 4``), brackets, signs,
implicit products ``2(3 + 4)``. A chain ``2 + 3 = 5 = 10/2`` has two links and both must hold. A GSM8K
annotation ``<<48/2=24>>`` is checked on its own, then removed before the rest of the text is read. LaTeX
(``\frac``, ``\dfrac``, ``\cdot``, ``\times``, ``\div``, ``\left( \right)``, braces, ``$...$``, ``\(...\)``,
``\$``, ``\,``, ``\text{cm}``, ``\boxed{}``, mixed numbers ``2\frac{1}{2}``) is rewritten as plain arithmetic
first. Unit words after numbers (``5 cm``, ``12 apples``) are dropped.

What is skipped, and why: a link is checked only when both sides surely are plain numbers. Skipped are
sides with a letter that is not a unit (``x = 3``, ``2x + 1 = 7``, ``f(2) = 5``), a word that carries
arithmetic (``25% of 80 = 20``, ``10 divided by 2``, ``1.5 million``), more than one kind of unit
(``2 hours = 120 minutes`` is a conversion) or a mixed quantity (``5 feet 6 inches``), a lone number
after a word, which labels rather than computes (``Day 2 = 10 pages``), an unknown LaTeX command (``\sqrt``), factorials and absolute
values, a bullet ``- 3 + 4 = 7``, malformed or unbalanced sides (``3 + = 5``, ``= 5``, ``3 + (4 = 7``),
ratios and times (``3:4``, ``12:30``), decimal commas (``2,5``), and sides past the guards
(a number over 40 digits, a side over 200 characters or 20 nested brackets, an exponent over 64 or a power
over 4,096 bits). ``≈ ~ < > <= >= != ≠`` are not equations. Skipping means "cannot tell": a step with
nothing checkable counts as right, so prose and plans are not punished; only a surely false equation makes a
step wrong. Only the first 2,000 characters of a step are read.

Comparing sides: equal as fractions, or one side is a lone decimal written with d places and the other side
rounds to it (lies within half a unit of its last place): ``10/3 = 3.33`` and ``10/3 = 3.3`` hold,
``10/3 = 3.4`` does not. A lone percentage also stands for its bare number, the convention of
``4/5 * 100 = 80%``. This module finds the equations and their sides; reading each side exactly and comparing
them is grpo_engine/rewards/equations.py's.

>>> step_equations_hold("Natalia sold 48/2 = <<48/2=24>>24 clips in May.")
True
>>> step_equations_hold("He pays 3 * 4 = 13 dollars")
False
>>> step_equations_hold(r"So $\frac{3}{4} \cdot 8 = 6$, and 1,000 + 250 = 1,250.")
True
>>> step_equations_hold("10/3 = 3.33, but 10/3 = 3.4")
False
>>> step_equations_hold("Let x be the apples, so 2x + 1 = 7 and 25% of 80 = 20.")
True
"""

from __future__ import annotations

import re

from grpo_engine.rewards.equations import Tok, link_holds

MAX_STEP_CHARS = 2000
MAX_EXPR_CHARS = 200
MAX_DEPTH = 20
MAX_FRACS = 64

_ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
_UNICODE = str.maketrans(
    {
        "×": "*",
        "·": "*",
        "⋅": "*",
        "∗": "*",
        "÷": "/",
        "−": "-",
        "–": "-",
        "²": "^2",
        "³": "^3",
        "≃": "≈",
        "≅": "≈",
        "∼": "≈",
        "\u2009": " ",
        "\u202f": " ",
        "\xa0": " ",
    }
)
_COMMANDS = {
    "times": "*",
    "cdot": "*",
    "ast": "*",
    "div": "/",
    "approx": "≈",
    "sim": "≈",
    "simeq": "≈",
    "neq": "≠",
    "ne": "≠",
    "leq": "≤",
    "le": "≤",
    "geq": "≥",
    "ge": "≥",
    "lt": "<",
    "gt": ">",
    "quad": " ",
    "qquad": " ",
    "boxed": "",
    "left": "",
    "right": "",
    "displaystyle": "",
    "big": "",
    "Big": "",
    "bigl": "",
    "bigr": "",
    "Bigl": "",
    "Bigr": "",
    "bigg": "",
    "Bigg": "",
}
_COMMAND_RE = re.compile(r"\\([A-Za-z]+)")
_FRAC_RE = re.compile(r"([0-9]+ ?)?\\[dtc]?frac(?![A-Za-z])")
_BRACE_RE = re.compile(r"[{}]")
_TEXT_RE = re.compile(r"\\(?:text[a-z]*|math(?:rm|bf|it)|mbox|operatorname)\s*\{([^{}]*)\}")
_POWER_STARS_RE = re.compile(r"(?<=[0-9)\]])\s*\*\*\s*(?=[0-9(\[.-])")
_TOKEN_RE = re.compile(
    r"""
    (?P<NUM>(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)
  | (?P<REL>!=|<=|>=|=>|=<|:=|<>|[<>≈≠≤≥~])
  | (?P<EQ>==?)
  | (?P<OP>\*\*|[-+*/^%])
  | (?P<LP>[(\[])
  | (?P<RP>[)\]])
  | (?P<CMD>\\[A-Za-z]+)
  | (?P<WORD>[^\W\d_]+)
  | (?P<PUNCT>\S)
""",
    re.VERBOSE,
)

# Words that carry arithmetic to the number after them (left of a side) or before them (right of a side):
# a side next to one is only part of the real expression, so the link is skipped. Neither kind is a unit.
_LEFT_BLOCK = frozenset(
    """of times plus minus over by than from and with into twice thrice half double triple
    square cube sqrt root log ln exp sin cos tan mod modulo add subtract multiply divide negative per choose
    divided multiplied""".split()
)
_RIGHT_BLOCK = frozenset(
    """of times plus minus over divided multiplied by squared cubed percent percentage per
    more less fewer than hundred hundreds thousand thousands million millions billion billions trillion dozen
    dozens half halves third thirds quarter quarters fourths fifths tenths mod modulo factorial choose to""".split()
)
_WEAK_LEFT = frozenset("and with from into".split())  # these carry arithmetic only after a number: "3 and 4"
_NOT_UNIT = _LEFT_BLOCK | _RIGHT_BLOCK
_SHORT_UNITS = frozenset("cm mm km kg mg ml ft yd mi lb oz hr pm am st nd rd th".split())


def step_equations_hold(step: str) -> bool:
    """Whether every checkable equation in one reasoning step is true (see the module docstring for the rules).

    False when any checkable equation (a GSM8K ``<<a=b>>`` annotation or a plain ``=`` link) is false;
    True when all of them hold, and True when the step holds none. Never raises on any string.
    """
    text = step[:MAX_STEP_CHARS]
    if not all(_equations_hold(body) for body in _ANNOTATION_RE.findall(text)):
        return False
    return _equations_hold(_ANNOTATION_RE.sub("", text))


def _equations_hold(text: str) -> bool:
    """Whether every checkable ``=`` link in a text (annotations already removed) holds."""
    toks = _tokenise(_latex_to_plain(text))
    for eq, tok in enumerate(toks):
        if tok.kind == "EQ":
            left, right = _side(toks, eq, -1), _side(toks, eq, 1)
            if left is not None and right is not None and not link_holds(left, right):
                return False
    return True


def _latex_to_plain(text: str) -> str:
    """LaTeX and Unicode math rewritten as plain arithmetic; unknown commands stay (``\\sqrt``: not checkable)."""
    text = text.translate(_UNICODE).replace("\\\\", " ").replace("&", " ")
    text = re.sub(r"\\[$()\[\]]|\$", " ", text)  # \$ currency, \( \) \[ \] and $ math delimiters
    text = re.sub(r"\\(?:left|right)\s*\.", " ", text)  # the invisible delimiters \left. and \right.
    text = _TEXT_RE.sub(r" \1 ", _replace_fracs(text))  # \text{ cm} becomes the plain word cm
    text = re.sub(r"\\[,;:!]", "", text).replace("\\ ", " ").replace("\\%", "%")  # thin spaces join 1\,000
    text = text.replace("\\{", "(").replace("\\}", ")")
    text = _COMMAND_RE.sub(lambda m: _COMMANDS.get(m.group(1), m.group(0)), text)
    text = text.replace("{,}", ",").replace("{", "(").replace("}", ")")  # braces group like brackets
    return _POWER_STARS_RE.sub("^", text).replace("**", " ")  # 2**3 is a power; other ** is markdown bold


def _replace_fracs(text: str) -> str:
    """``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``, ``\\frac12``) as ``((a)/(b))``, a mixed number
    ``2\\frac{1}{2}`` as ``(2+(1)/(2))``; at most MAX_FRACS.

    Working from the last one back means a fraction's arguments never hold an unconverted ``\\frac``.
    """
    for match in reversed(list(_FRAC_RE.finditer(text))[-MAX_FRACS:]):
        num = _latex_argument(text, match.end())
        den = _latex_argument(text, num[1]) if num else None
        if den:
            whole = f"{match.group(1)}+" if match.group(1) else ""  # a mixed number: 2\frac{1}{2} is 2 + 1/2
            text = f"{text[: match.start()]}({whole}({num[0]})/({den[0]})){text[den[1] :]}"
    return text


def _latex_argument(text: str, i: int) -> tuple[str, int] | None:
    """The argument of a LaTeX command starting at ``text[i]``: (body, end) of a balanced ``{...}`` or of one
    letter or digit; None when there is none."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return (text[i], i + 1) if i < len(text) and text[i].isalnum() else None
    depth = 0
    for brace in _BRACE_RE.finditer(text, i):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[i + 1 : brace.start()], brace.end()
    return None


def _tokenise(text: str) -> list[Tok]:
    """Tokens of plain text; a lone ``x`` between two spaced numbers (``3 x 4``) becomes ``*``."""
    toks = [Tok(m.lastgroup, m.group(), m.start(), m.end()) for m in _TOKEN_RE.finditer(text)]
    for i in range(1, len(toks) - 1):
        before, tok, after = toks[i - 1], toks[i], toks[i + 1]
        if (
            tok.text in ("x", "X")
            and before.kind in ("NUM", "RP")
            and after.kind in ("NUM", "LP")
            and before.end < tok.start
            and tok.end < after.start
        ):
            toks[i] = tok._replace(kind="OP", text="*")
    return toks


def _attached(a: Tok, b: Tok) -> bool:
    """Whether two tokens touch, with no space between them."""
    return a.end == b.start


def _is_unit(toks: list[Tok], j: int) -> bool:
    """Whether word ``toks[j]`` is a unit after a number (``5 cm``, ``12 apples``, ``3kg``) rather than a
    variable (one letter, ``2x``), a math word (``squared``, ``of``) or letters glued to it (``3xy``)."""
    word = toks[j].text.lower()
    if len(word) < 2 or word in _NOT_UNIT or j == 0 or toks[j - 1].kind != "NUM":
        return False
    return not _attached(toks[j - 1], toks[j]) or len(word) > 2 or word in _SHORT_UNITS


def _side(toks: list[Tok], eq: int, step: int) -> list[Tok] | None:
    """The tokens of the arithmetic just before (step -1) or after (step 1) the ``=`` at ``toks[eq]``: numbers,
    operators, brackets and unit words; None when that side is not checkable."""
    opener, closer = ("RP", "LP") if step < 0 else ("LP", "RP")
    j, depth = eq + step, 0
    while 0 <= j < len(toks):
        tok = toks[j]
        if tok.kind == opener:
            depth += 1
        elif tok.kind == closer:
            if depth == 0:
                break  # an unmatched bracket opens or closes an aside: "(so 3 + 4 = 7)"
            depth -= 1
        elif tok.kind == "WORD":
            # a unit sits inside arithmetic before an operator ("5 cm + 3 cm"); after one, it ends the side
            carries_on = j + 1 < len(toks) and toks[j + 1].kind in ("OP", "RP", "EQ")
            if not _is_unit(toks, j) or (step < 0 and not carries_on):
                break
            if not carries_on:
                j += step
                break
        elif tok.kind not in ("NUM", "OP"):
            break
        if depth > MAX_DEPTH or abs(tok.start - toks[eq].start) > MAX_EXPR_CHARS:
            return None
        j += step
    if depth or j == eq + step:
        return None
    if step < 0:  # a lone number after a word labels rather than computes: "Day 2 = 10 pages"
        label = j == eq - 2 and j >= 0 and toks[j].kind == "WORD"
        return toks[j + 1 : eq] if _left_edge_ok(toks, j, j + 1) and not label else None
    return toks[eq + 1 : j] if _right_edge_ok(toks, j, j - 1) else None


def _left_edge_ok(toks: list[Tok], j: int, s: int) -> bool:
    """Whether ``toks[j]`` (j < 0: the start), just before a left side starting at ``toks[s]``, leaves that side
    standing alone: not a variable (``x + 2``), a function (``f(2)``), a carrying word (``of 80``), a glued
    ratio (``3:4``), a factorial or absolute value."""
    tok, first = (toks[j] if j >= 0 else None), toks[s]
    if tok is not None and tok.kind in ("EQ", "REL"):
        return True
    if first.kind == "OP" and not (
        first.text in "+-" and _attached(first, toks[s + 1]) and (tok is None or not _attached(tok, first))
    ):
        return False  # "+"/"-" is a sign only when written against its number ("is -3"), not a bullet "- 3"
    if tok is None:
        return True
    if tok.kind == "LP":
        return j == 0 or (toks[j - 1].kind in ("WORD", "PUNCT") and _left_edge_ok(toks, j - 1, j))
    if tok.kind == "WORD":
        word = tok.text.lower()
        if word in _WEAK_LEFT:  # "3 and 4 = 7" is a sum; "2 * 3 = 6 and 6 + 1 = 7" is two equations
            return _ends_equation(toks, j - 1)
        # a unit before the side makes a mixed quantity: "5 feet 6 inches = 66 inches"
        return not (word in _LEFT_BLOCK or len(word) == 1 or _attached(tok, first) or _is_unit(toks, j))
    if tok.kind == "PUNCT":
        before = toks[j - 1] if j > 0 else None
        glued = before is not None and _attached(before, tok) and before.kind in ("NUM", "RP", "WORD")
        if tok.text == "|" or (tok.text == "!" and glued and before.kind != "WORD"):
            return False
        return not (glued and _attached(tok, first))
    return False  # a LaTeX command (\sqrt, \pi) is an operand the checker cannot read


def _ends_equation(toks: list[Tok], k: int) -> bool:
    """Whether ``toks[k]`` is not arithmetic, or ends arithmetic that is the right side of an ``=``."""
    j = k
    while j >= 0 and k - j < 100 and (toks[j].kind in ("NUM", "OP", "LP", "RP") or _is_unit(toks, j)):
        j -= 1
    return j == k or (j >= 0 and toks[j].kind == "EQ")


def _right_edge_ok(toks: list[Tok], j: int, last: int) -> bool:
    """Whether ``toks[j]`` (j past the end: the end), just after a right side ending at ``toks[last]``, leaves
    that side standing alone: not a variable (``2x``), a carrying word (``squared``, ``million``), a glued
    ratio or time (``12:30``), or a factorial."""
    if j >= len(toks):
        return True
    tok, end = toks[j], toks[last]
    if tok.kind == "NUM":  # only after a unit: a mixed quantity, "= 5 feet 6 inches"
        return False
    if tok.kind in ("EQ", "REL", "LP"):
        return True
    if tok.kind == "RP":
        return j + 1 == len(toks) or (toks[j + 1].kind in ("WORD", "PUNCT") and _right_edge_ok(toks, j + 1, j))
    if tok.kind == "WORD":
        word = tok.text.lower()
        return not (word in _RIGHT_BLOCK or len(word) == 1 or _attached(end, tok))
    if tok.kind == "PUNCT":
        after = toks[j + 1] if j + 1 < len(toks) else None
        if tok.text == "|" or (tok.text == "!" and _attached(end, tok)):
            return False
        return not (
            _attached(end, tok) and after is not None and _attached(tok, after) and after.kind in ("NUM", "LP", "WORD")
        )
    return False
