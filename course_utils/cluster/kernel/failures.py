"""What the learner sees when code fails on the engines: one line per group of ranks with the
same error, then the learner's own lines from the remote traceback (not ipyparallel's, torch's
or ours). Pure functions of the text ipyparallel sends back, so they are unit-tested without a
cluster. Introduced in ``00_cluster_tour``.

Frameworks add their own readings of known library messages with :func:`add_translator`
(``torch_dist`` maps a mismatched collective and a timed-out group to errors naming the fix).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...errors import CourseError, EngineError

#: Ranks listed one by one before the rest are summarised.
MAX_GROUPS = 4
#: Learner frames shown from the remote traceback.
MAX_FRAMES = 3

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# IPython >= 8:  "File /path/x.py:12, in f(a)"  or  "Cell In[3], line 7, in learner_fn(n)"
_IPY_FILE = re.compile(r"^File (?P<file>.+?):(?P<line>\d+)(?:, in (?P<func>[^\s(]+))?")
_IPY_CELL = re.compile(
    r"^Cell In\s*\[(?P<cell>\d*)\], line (?P<line>\d+)(?:, in (?P<func>[^\s(]+))?")
_IPY_CODE = re.compile(r"^-*>\s*(?P<line>\d+)\s?(?P<code>.*)$")
# plain Python:  File "/path/x.py", line 12, in f
_PY_FILE = re.compile(r'^\s*File "(?P<file>.+?)", line (?P<line>\d+), in (?P<func>\S+)')
_LIBRARY = ("site-packages", "dist-packages", "/course_utils/", "/lib/python3", "<string>",
            "<frozen")
_CELL_FILE = re.compile(r"(ipykernel_\d+|<ipython-input-)")


@dataclass(frozen=True)
class Failure:
    """One rank's error as ipyparallel reports it."""

    rank: int | None
    engine_id: int | None
    ename: str
    evalue: str
    traceback: str = ""
    #: the rank's host, set only when the ranks span several hosts
    host: str | None = None

    @property
    def where(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"engine {self.engine_id}"
        return f"{who} on {self.host}" if self.host else who


@dataclass(frozen=True)
class Frame:
    file: str  # "Cell In[3]" for a notebook / %%px cell
    line: int
    func: str
    code: str

    def text(self) -> str:
        where = self.file if self.file.startswith("Cell") else self.file.rsplit("/", 1)[-1]
        code = f": {self.code.strip()}" if self.code.strip() else ""
        return f"{where}, line {self.line}, in {self.func}{code}"


Translator = Callable[[Sequence[Failure]], CourseError | None]
_TRANSLATORS: dict[str, Translator] = {}


def add_translator(key: str, fn: Translator | None) -> None:
    """Register ``fn(failures) -> CourseError | None`` for known library messages."""
    if fn is None:
        _TRANSLATORS.pop(key, None)
    else:
        _TRANSLATORS[key] = fn


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text or "")


def frames(traceback: str) -> list[Frame]:
    """Every frame of a remote traceback (IPython's verbose format or plain Python's)."""
    out: list[Frame] = []
    lines = strip_ansi(traceback).splitlines()
    cur: dict[str, object] | None = None
    for i, raw in enumerate(lines):
        line = raw.rstrip()
        m = _IPY_CELL.match(line)
        if m:
            cur = {"file": f"Cell In[{m['cell']}]", "line": int(m["line"]),
                   "func": m["func"] or "<module>", "code": ""}
            out.append(Frame(**cur))  # type: ignore[arg-type]
            continue
        m = _IPY_FILE.match(line) or _PY_FILE.match(line)
        if m:
            code = ""
            if m.re is _PY_FILE and i + 1 < len(lines) and not _PY_FILE.match(lines[i + 1]):
                code = lines[i + 1].strip()
            cur = {"file": m["file"], "line": int(m["line"]), "func": m["func"] or "<module>",
                   "code": code}
            out.append(Frame(**cur))  # type: ignore[arg-type]
            continue
        m = _IPY_CODE.match(line.strip())
        if m and cur is not None and out and not out[-1].code:
            out[-1] = Frame(out[-1].file, int(m["line"]), out[-1].func, m["code"])
    return out


def is_learner_frame(frame: Frame) -> bool:
    """A frame of the learner's code: a notebook or ``%%px`` cell, or a file outside Python's
    libraries and this package."""
    if frame.file.startswith("Cell In") or _CELL_FILE.search(frame.file):
        return True
    return not any(part in frame.file for part in _LIBRARY)


def learner_frames(traceback: str, limit: int = MAX_FRAMES) -> list[Frame]:
    """The last ``limit`` frames of the learner's own code, innermost last."""
    return [f for f in frames(traceback) if is_learner_frame(f)][-limit:]


def ranks_where(found: Sequence[Failure]) -> str:
    """``"ranks 0-1"``, with their hosts where known: ``"ranks 0-1 on rig-a"``,
    ``"ranks 1-2 (on rig-a, rig-b)"``."""
    ranks = rank_list([f.rank for f in found if f.rank is not None] or [0])
    return ranks + on_hosts([f.host for f in found if f.host])


def on_hosts(hosts: Iterable[str]) -> str:
    """``" on rig-b"``, ``" (on rig-a, rig-b)"``, or ``""`` for no host."""
    named = sorted(set(hosts))
    if not named:
        return ""
    return f" on {named[0]}" if len(named) == 1 else f" (on {', '.join(named)})"


def rank_list(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``"ranks 0-3"``; ``[0, 2, 5]`` -> ``"ranks 0, 2, 5"``;
    one -> ``"rank 4"``."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return "ranks " + ", ".join(parts)


def _split_fix(evalue: str) -> tuple[str, str | None]:
    """A CourseError raised on an engine arrives as ``cause\\nFix: fix``; split it."""
    head, sep, fix = evalue.partition("\nFix: ")
    return (head, fix.strip()) if sep else (evalue, None)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def your_lines(failures: Sequence[Failure], max_frames: int = MAX_FRAMES) -> list[str]:
    """The learner's frames of the first failing rank, as indented lines (empty if none)."""
    first = min(failures, key=_key, default=None)
    shown = learner_frames(first.traceback, max_frames) if first else []
    if not shown:
        return []
    return [f"your code ({first.where}, innermost last):", *[f"  {fr.text()}" for fr in shown]]


def describe(failures: Sequence[Failure], max_groups: int = MAX_GROUPS,
             max_frames: int = MAX_FRAMES) -> CourseError:
    """The learner-facing error for failures on several ranks (see the module docstring).

    A registered translator that recognises the failures gives the cause and fix; the
    learner's lines are added either way.
    """
    for fn in list(_TRANSLATORS.values()):
        err = fn(failures)
        if err is not None:
            extra = your_lines(failures, max_frames)
            if extra:
                err = type(err)(err.cause + "\n  " + "\n  ".join(extra), err.fix)
            return err
    groups: dict[tuple[str, str], list[Failure]] = {}
    for f in failures:
        groups.setdefault((f.ename, f.evalue), []).append(f)
    lines, fixes = [], []
    ordered = sorted(groups.items(), key=lambda kv: min(_key(f) for f in kv[1]))
    for (ename, evalue), members in ordered[:max_groups]:
        cause, fix = _split_fix(evalue)
        if fix:
            fixes.append(fix)
        ranks = [f.rank for f in members if f.rank is not None]
        who = rank_list(ranks) if len(ranks) == len(members) else \
            ", ".join(f.where for f in members)
        lines.append(f"[{who}] {ename}: {_short(cause)}")
    if len(ordered) > max_groups:
        rest = sum(len(m) for _, m in ordered[max_groups:])
        lines.append(f"... and {rest} more rank(s) with other errors")
    lines += your_lines(failures, max_frames)
    n = len(failures)
    cause = f"code failed on {n} rank{'s' if n != 1 else ''}:\n  " + "\n  ".join(lines)
    fix = fixes[0] if len(set(fixes)) == 1 and len(fixes) == len(ordered[:max_groups]) else (
        "read the error and your lines above; fix the code and re-run the cell")
    return EngineError(cause, fix)


def _key(f: Failure) -> int:
    return f.rank if f.rank is not None else 10**6 + (f.engine_id or 0)
