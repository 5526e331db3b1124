"""One line of ``course workshop check``: a check's name, PASS/FAIL/SKIP, what it saw and
the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    name: str
    status: str        # PASS, FAIL or SKIP
    detail: str
    fix: str = ""

    def text(self) -> str:
        out = f"[{self.status}] {self.name}: {self.detail}"
        return out + (f" -> fix: {self.fix}" if self.status == "FAIL" and self.fix else "")
