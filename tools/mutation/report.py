"""The mutation report: per exercise, the mutants made, killed, equivalent, survived and timed
out, whether any left the ranks' group damaged, and the seconds the visible tests needed to
kill (median and most), from the JSON lines the mutant items write (``COURSE_MUTANTS_OUT``).

``python -m tools.mutation.report OUTCOMES.jsonl [--out docs/mutants.md] [--update]`` (``make
mutants`` runs every mutant, then this). With ``--update`` the outcomes replace only their own
units' rows and gaps in ``--out``; the other units' lines stay as the last run wrote them
(``make mutants UNIT=03`` runs one unit's mutants in minutes, where all of them take an hour).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

STATUSES = ("killed", "equivalent", "survived", "timeout")


def read(path: Path) -> list[dict]:
    """The outcomes, the last one of each mutant (a re-run replaces the earlier one)."""
    last: dict[tuple[str, str], dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            o = json.loads(line)
            last[(o["notebook"], o["mutant"])] = o
    return list(last.values())


HEAD = ("| unit | exercise | made | killed | equivalent | survived | timed out | damaged "
        "| s to kill (median / most) |\n| --- | --- | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |")
#: A row of the table as :func:`table` writes it: unit, exercise, six counts, seconds.
ROW = re.compile(r"^\| (\d\d) \| (\S+) \|((?: \d+ \|){6}) (.*) \|$")
#: A line of the gaps' list: its unit.
GAP = re.compile(r"^- `(\d\d)` ")


def rows_of(outcomes: list[dict]) -> list[str]:
    """One Markdown row per exercise (a solution cell), in notebook order."""
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for o in outcomes:
        rows[(o["notebook"], o["exercise"])].append(o)
    lines = []
    for (nb, ex), got in sorted(rows.items()):
        n = {s: sum(o["status"] == s for o in got) for s in STATUSES}
        damaged = sum(bool(o.get("damaged")) for o in got)
        kill_s = [o["seconds"] for o in got if o["status"] == "killed"]
        secs = (f"{statistics.median(kill_s):.1f} / {max(kill_s):.1f}" if kill_s else "-")
        lines.append(f"| {nb[:2]} | {ex} | {len(got)} | {n['killed']} | {n['equivalent']} | "
                     f"{n['survived']} | {n['timeout']} | {damaged} | {secs} |")
    return lines


def table(outcomes: list[dict], kept: Sequence[str] = ()) -> str:
    """The rows of ``outcomes`` and the ``kept`` rows of other units, by unit and exercise,
    then the total of them all."""
    rows = sorted([*kept, *rows_of(outcomes)],
                  key=lambda r: ROW.match(r).group(1, 2))  # type: ignore[union-attr]
    total = [0] * 6
    for r in rows:
        counts = ROW.match(r).group(3).strip(" |").split(" | ")  # type: ignore[union-attr]
        total = [a + int(b) for a, b in zip(total, counts, strict=True)]
    return "\n".join([HEAD, *rows, "| all | | " + " | ".join(map(str, total)) + " | |"])


def not_killed(outcomes: list[dict], kept: Sequence[str] = ()) -> str:
    """The mutants that survived or timed out, and those that damaged the group: the gaps
    (after the ``kept`` lines of other units)."""
    out = list(kept)
    for o in sorted(outcomes, key=lambda o: (o["notebook"], o["mutant"])):
        if o["status"] in ("survived", "timeout") or o.get("damaged"):
            why = o["status"] + (", damaged the group" if o.get("damaged") else "")
            out.append(f"- `{o['notebook'][:2]}` {o['mutant']}: **{why}**")
    return "\n".join(out) or "(none)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outcomes", type=Path)
    ap.add_argument("--out", type=Path, help="write the report here (else print it)")
    ap.add_argument("--update", action="store_true",
                    help="replace only the outcomes' units in --out; keep the other units' lines")
    args = ap.parse_args(argv)
    outcomes = read(args.outcomes)
    body = args.out.read_text() if args.out and args.out.exists() else ""
    units = {o["notebook"][:2] for o in outcomes}
    rows, gaps = kept_lines(body, units) if args.update else ([], [])
    text = (f"## Per exercise\n\n{table(outcomes, rows)}\n\n"
            "## Not killed, or killed leaving the group damaged\n\n"
            f"{not_killed(outcomes, gaps)}\n")
    if args.out:
        marker = "<!-- mutation report: generated below -->"
        head = body.split(marker)[0] if marker in body else body
        args.out.write_text(f"{head.rstrip()}\n\n{marker}\n\n{text}" if head.strip()
                            else f"{marker}\n\n{text}")
    else:
        print(text)
    return 0


def kept_lines(body: str, units: set[str]) -> tuple[list[str], list[str]]:
    """The table rows and gap lines of ``body`` (a report) whose unit is not in ``units``."""
    rows = [ln for ln in body.splitlines() if (m := ROW.match(ln)) and m.group(1) not in units]
    gaps = [ln for ln in body.splitlines() if (m := GAP.match(ln)) and m.group(1) not in units]
    return rows, gaps


if __name__ == "__main__":
    raise SystemExit(main())
