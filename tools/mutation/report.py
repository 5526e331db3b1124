"""The mutation report: per exercise, the mutants made, killed, equivalent, survived and timed
out, whether any left the ranks' group damaged, and the seconds the visible tests needed to
kill (median and most), from the JSON lines the mutant items write (``COURSE_MUTANTS_OUT``).

``python -m tools.mutation.report OUTCOMES.jsonl [--out docs/mutants.md]`` (``make mutants``
runs every mutant, then this).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
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


def table(outcomes: list[dict]) -> str:
    """One Markdown row per exercise (a solution cell), in notebook order, and the total."""
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for o in outcomes:
        rows[(o["notebook"], o["exercise"])].append(o)
    head = ("| unit | exercise | made | killed | equivalent | survived | timed out | damaged "
            "| s to kill (median / most) |\n| --- | --- | ---: | ---: | ---: | ---: | ---: "
            "| ---: | ---: |")
    lines = [head]
    total = defaultdict(int)
    for (nb, ex), got in sorted(rows.items()):
        n = {s: sum(o["status"] == s for o in got) for s in STATUSES}
        damaged = sum(bool(o.get("damaged")) for o in got)
        kill_s = [o["seconds"] for o in got if o["status"] == "killed"]
        secs = (f"{statistics.median(kill_s):.1f} / {max(kill_s):.1f}" if kill_s else "-")
        lines.append(f"| {nb[:2]} | {ex} | {len(got)} | {n['killed']} | {n['equivalent']} | "
                     f"{n['survived']} | {n['timeout']} | {damaged} | {secs} |")
        for s in STATUSES:
            total[s] += n[s]
        total["made"] += len(got)
        total["damaged"] += damaged
    lines.append(f"| all | | {total['made']} | {total['killed']} | {total['equivalent']} | "
                 f"{total['survived']} | {total['timeout']} | {total['damaged']} | |")
    return "\n".join(lines)


def not_killed(outcomes: list[dict]) -> str:
    """The mutants that survived or timed out, and those that damaged the group: the gaps."""
    out = []
    for o in sorted(outcomes, key=lambda o: (o["notebook"], o["mutant"])):
        if o["status"] in ("survived", "timeout") or o.get("damaged"):
            why = o["status"] + (", damaged the group" if o.get("damaged") else "")
            out.append(f"- `{o['notebook'][:2]}` {o['mutant']}: **{why}**")
    return "\n".join(out) or "(none)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outcomes", type=Path)
    ap.add_argument("--out", type=Path, help="write the report here (else print it)")
    args = ap.parse_args(argv)
    outcomes = read(args.outcomes)
    text = (f"## Per exercise\n\n{table(outcomes)}\n\n"
            f"## Not killed, or killed leaving the group damaged\n\n{not_killed(outcomes)}\n")
    if args.out:
        body = args.out.read_text() if args.out.exists() else ""
        marker = "<!-- mutation report: generated below -->"
        head = body.split(marker)[0] if marker in body else body
        args.out.write_text(f"{head.rstrip()}\n\n{marker}\n\n{text}" if head.strip()
                            else f"{marker}\n\n{text}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
