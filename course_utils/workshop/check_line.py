"""One line of ``course workshop check``: a check's name, PASS/FAIL/WARN/SKIP, what it saw and
the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    name: str
    status: str        # PASS, FAIL, WARN (a risk the instructor may accept) or SKIP
    detail: str
    fix: str = ""

    def text(self) -> str:
        out = f"[{self.status}] {self.name}: {self.detail}"
        shown = self.status in ("FAIL", "WARN") and self.fix
        return out + (f" -> fix: {self.fix}" if shown else "")
