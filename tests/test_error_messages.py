"""Every error the course raises names what happened and the fix.

Read from the source, so that a new ``raise`` is held to it on the day it is written: a
:class:`~course_utils.errors.CourseError` (whose message ends with a ``Fix:`` line) gets a cause
and a fix that both have words in them, and a built-in exception gets a message of at least a few
words (its fix in the words, e.g. "run the %%px cell first"). The cluster-level error paths
themselves are run for real in ``test_cluster.py``, ``test_failures.py`` and the mistakes
catalogue; here :func:`test_course_errors_render_cause_and_fix` checks what a learner sees.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import course_utils
from course_utils import errors

PACKAGE = Path(course_utils.__file__).parent
#: Words a message must have in its literal text (a bare name or value says nothing).
MIN_WORDS = 3


def _course_error_names() -> set[str]:
    """Every CourseError subclass defined anywhere in the package, by class name (a fixed
    point over the class statements: a class whose base is one is one)."""
    classes = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases}
                classes.append((node.name, bases))
    names = {"CourseError"}
    while True:
        more = {name for name, bases in classes if bases & names} - names
        if not more:
            return names
        names |= more


def _literal_words(node: ast.AST | None) -> int:
    """How many words the literal parts of a message expression hold (f-strings, +, calls of
    str methods on literals); names and calls count for nothing."""
    if node is None:
        return 0
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value.split())
    if isinstance(node, ast.JoinedStr):
        return sum(_literal_words(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _literal_words(node.left) + _literal_words(node.right)
    if isinstance(node, ast.IfExp):
        return min(_literal_words(node.body), _literal_words(node.orelse))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _literal_words(node.func.value) + sum(_literal_words(a) for a in node.args)
    return 0


def _raises() -> list[tuple[str, int, str, list[ast.expr], list[ast.keyword]]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                found.append((rel, node.lineno, name, node.exc.args, node.exc.keywords))
    return found


RAISES = _raises()
COURSE_ERRORS = _course_error_names()


def test_the_source_scan_sees_the_package():
    names = {name for _, _, name, _, _ in RAISES}
    assert len(RAISES) > 100 and {"EngineError", "ClusterTimeout", "ValueError"} <= names
    assert {"EngineError", "TFTimeout", "GradingError", "SlidesError"} <= COURSE_ERRORS


def test_every_course_error_is_raised_with_a_cause_and_a_fix():
    """``CourseError(cause, fix)``: both given, both with words in them (or built by a helper
    that returns the pair, ``*message(...)``)."""
    bad = []
    for rel, line, name, args, keywords in RAISES:
        if name not in COURSE_ERRORS:
            continue
        if any(isinstance(a, ast.Starred) for a in args):
            continue  # a helper returns (cause, fix); its own text is checked where it is built
        given = list(args) + [k.value for k in keywords if k.arg in ("cause", "fix")]
        if len(given) < 2:
            bad.append(f"{rel}:{line} {name}: no fix given")
        elif _literal_words(given[1]) < 2 and not isinstance(
                given[1], ast.Name | ast.Call | ast.Attribute | ast.Subscript):
            bad.append(f"{rel}:{line} {name}: the fix has no words")
    assert not bad, "\n".join(bad)


def test_every_builtin_exception_says_what_happened_in_words():
    """A ``ValueError``/``RuntimeError``/... the course raises has a message of at least
    ``MIN_WORDS`` literal words: never a bare value such as ``KeyError(grade_id)``."""
    bad = []
    for rel, line, name, args, _ in RAISES:
        if name in COURSE_ERRORS or not name.endswith(("Error", "Exception")):
            continue
        # The message: the first argument that is not a number (HTTPError(409, reason)).
        text = next((a for a in args if not (isinstance(a, ast.Constant)
                                             and isinstance(a.value, int))), None)
        words = _literal_words(text)
        named = isinstance(text, ast.Call | ast.Name) and name != "KeyError"  # built elsewhere
        if words < MIN_WORDS and not named:
            bad.append(f"{rel}:{line} {name}: {words} word(s) of message")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("cls", sorted(
    (c for c in vars(errors).values()
     if inspect.isclass(c) and issubclass(c, errors.CourseError)), key=lambda c: c.__name__))
def test_course_errors_render_cause_and_fix(cls):
    """What IPython shows a learner: the class, the cause, and a ``Fix:`` line (no traceback)."""
    err = cls("rank 1 is gone", "run cu.restart()")
    assert str(err) == "rank 1 is gone\nFix: run cu.restart()"
    shown = err._render_traceback_()
    assert cls.__name__ in shown[0] and "rank 1 is gone" in shown[0]
    assert shown[-1] == "Fix: run cu.restart()"
