"""One format for every test message a learner reads: what was checked, what was expected,
what was found, and what to try. Used by the test cells of units 0-2 (and the pure explainers
in this package), so a failing test never shows a bare ``AssertionError``."""

from __future__ import annotations


def feedback(checked: str, expected: str, found: str, fix: str) -> str:
    """The four-line message of a failing check.

    >>> print(feedback("the sum", "3", "4", "add, do not multiply"))
    checked:  the sum
    expected: 3
    found:    4
    try:      add, do not multiply
    """
    return (f"checked:  {checked}\nexpected: {expected}\nfound:    {found}\n"
            f"try:      {fix}")
