"""The results of ``course grade``: per student, notebook and question, with each failure's
one-line reason and notes on tampering (a test cell edited or deleted); written as
``grades.csv`` and ``grades.json`` (:class:`ClassGrades`)."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nbformat import NotebookNode

from ..notebook_cells import grade_id, nbgrader_meta

REASON_CHARS = 240
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FEEDBACK_DROP = ("checked:", "try:", "expected:")  # checks.feedback's lines, least use first


@dataclass
class Question:
    question: str
    score: float
    max_score: float
    reason: str = ""
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score > 0

    @property
    def by_hand(self) -> bool:
        return self.note.startswith("graded by hand")


@dataclass
class NotebookGrade:
    student: str
    assignment: str
    notebook: str
    score: float
    max_score: float
    seconds: float
    status: str  # "graded", "timeout" (a cell hit its limit), "error" (nbgrader could not run it)
    error: str = ""
    notes: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


@dataclass
class Graded:
    """What one grading run returns: the grades in the class's order, the clusters' start
    times, and the job processes (``course grade --jobs N``)."""
    grades: list[NotebookGrade] = field(default_factory=list)
    resets: list[float] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


@dataclass
class ClassGrades:
    root: Path
    notebooks: list[NotebookGrade] = field(default_factory=list)
    seconds: float = 0.0
    reset_seconds: list[float] = field(default_factory=list)
    cell_timeout: int = 0
    notebook_timeout: int = 0
    #: the processes of ``course grade --jobs N`` (empty for one job, graded in this process)
    job_pids: list[int] = field(default_factory=list)

    def student(self, name: str) -> list[NotebookGrade]:
        return [g for g in self.notebooks if g.student == name]

    def totals(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for g in self.notebooks:
            s, m = out.get(g.student, (0.0, 0.0))
            out[g.student] = (s + g.score, m + g.max_score)
        return out

    def rows(self) -> list[dict]:
        return [{"student": g.student, "assignment": g.assignment, "notebook": g.notebook,
                 "question": q.question, "score": q.score, "max_score": q.max_score,
                 "passed": q.passed, "reason": q.reason, "note": q.note}
                for g in self.notebooks for q in g.questions]

    def write(self, folder: str | Path | None = None) -> tuple[Path, Path]:
        """Write ``grades.csv`` (one row per student and question) and ``grades.json``."""
        folder = Path(folder or self.root)
        csv_path, json_path = folder / "grades.csv", folder / "grades.json"
        fields = ["student", "assignment", "notebook", "question", "score", "max_score",
                  "passed", "reason", "note"]
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(self.rows())
        doc = {
            "course": str(self.root), "seconds": round(self.seconds, 1),
            "cell_timeout": self.cell_timeout, "notebook_timeout": self.notebook_timeout,
            "reset_seconds": [round(s, 2) for s in self.reset_seconds],
            "students": [
                {"student": s, "score": t[0], "max_score": t[1],
                 "notebooks": [_nb_dict(g) for g in self.student(s)]}
                for s, t in self.totals().items()],
        }
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
        return csv_path, json_path

    def table(self) -> str:
        """The score table: one line per graded notebook."""
        lines = [f"{'student':<16} {'assignment':<10} {'score':>9} {'time':>7}  first reason"]
        for g in self.notebooks:
            failed = next((q for q in g.questions if not q.passed and not q.by_hand), None)
            why = g.error or (f"{failed.question}: {failed.reason}" if failed else "")
            lines.append(f"{g.student:<16} {g.assignment:<10} {g.score:>4g}/{g.max_score:<4g} "
                         f"{g.seconds:>6.1f}s  {why[:90]}")
        return "\n".join(lines)

    def summary(self) -> str:
        n = len(self.notebooks)
        students = len(self.totals())
        full = sum(1 for s, m in self.totals().values() if s >= m > 0)
        times = [g.seconds for g in self.notebooks]
        resets = self.reset_seconds
        mean, worst = sum(times) / max(n, 1), max(times or [0])
        return (f"graded {n} notebook(s) of {students} student(s) in {self.seconds:.1f} s "
                f"(per notebook: mean {mean:.1f} s, max {worst:.1f} s; "
                f"cluster reset: mean {sum(resets) / max(len(resets), 1):.1f} s); "
                f"full marks: {full}/{students}; "
                f"total {sum(g.score for g in self.notebooks):g}/"
                f"{sum(g.max_score for g in self.notebooks):g} points")


def _nb_dict(g: NotebookGrade) -> dict:
    d = asdict(g)
    d["seconds"] = round(g.seconds, 1)
    for q, qd in zip(g.questions, d["questions"], strict=True):
        qd["passed"] = q.passed
    return d


# ---- reasons ---------------------------------------------------------------------------------
def one_line_reason(ename: str, evalue: str, limit: int = REASON_CHARS) -> str:
    """``ename: evalue`` on one line: ANSI codes and a course error's ``Fix:`` line dropped,
    identical per-rank errors collapsed (``[ranks 0, 1] ValueError: ...``). A test's
    ``checks.feedback`` message that is too long loses its ``checked:``, then ``try:``, then
    ``expected:`` line before anything is cut, so what was *found* stays."""
    text = _ANSI.sub("", evalue or "")
    text = text.split("\nFix:")[0]
    lines = text.splitlines()
    for key in _FEEDBACK_DROP:
        if len(_ANSI.sub("", ename)) + 2 + len(" ".join(" ".join(lines).split())) <= limit:
            break
        lines = [ln for ln in lines if not ln.startswith(key)]
    text = "\n".join(lines)
    per_rank = re.findall(r"\[rank (\d+)\] (.+)", text)
    if per_rank:
        by_msg: dict[str, list[str]] = {}
        for r, msg in per_rank:
            by_msg.setdefault(msg.strip(), []).append(r)
        head = text.split("[rank ")[0]
        text = head + " ".join(
            f"[rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}] {msg}"
            for msg, rs in by_msg.items())
    text = " ".join(text.split())
    out = f"{_ANSI.sub('', ename)}: {text}" if text else _ANSI.sub("", ename)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def cell_reason(cell: NotebookNode) -> str:
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return ""
    e = errors[-1] if errors[-1].get("ename") != "KeyboardInterrupt" else errors[0]
    return one_line_reason(e.get("ename", "Error"), e.get("evalue", ""))


def tampering(submitted: NotebookNode, released: NotebookNode) -> dict[str, str]:
    """Locked cells (tests and lesson cells) the student edited or deleted: grade_id -> what."""
    sub = {grade_id(c): c for c in submitted.cells
           if grade_id(c)}
    out = {}
    for cell in released.cells:
        m = nbgrader_meta(cell)
        gid = m.get("grade_id")
        if not gid or not m.get("locked"):
            continue
        if gid not in sub:
            out[gid] = "deleted"
        elif sub[gid].source.strip() != cell.source.strip():
            out[gid] = "edited"
    return out
