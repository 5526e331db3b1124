"""The mutant items' selection and the mutation report (tests/notebook_items/mutants.py,
tools/mutation/report.py), without a kernel; the items themselves run inside nbval's run."""

from __future__ import annotations

import json

from tests.notebook_items import mutants as mut
from tools.mutation import report


def test_every_mutant_has_its_own_short_id_and_a_draw_is_replayed_by_its_seed(monkeypatch):
    every = mut.all_mutants()
    assert len({e.id for e in every}) == len(every)
    cells = {(e.notebook, e.at) for e in every}
    one = mut.drawn("1", 7)
    assert len(one) == len(cells) and {(e.notebook, e.at) for e in one} == cells
    assert [e.id for e in mut.drawn("1", 7)] == [e.id for e in one]
    assert [e.id for e in mut.drawn("1", 8)] != [e.id for e in one]
    assert len(mut.drawn("all", 0)) == len(every)
    # a mutant listed as equivalent is never drawn
    listed = (one[0].notebook, one[0].mutant.id)
    monkeypatch.setattr(mut, "equivalent", lambda: {listed: "why"})
    assert all((e.notebook, e.mutant.id) != listed for s in range(20) for e in mut.drawn("1", s))


def test_a_run_draws_its_few_across_the_quick_cells_only():
    some = mut.drawn("0", 7, per_run=6)
    assert len(some) == 6 and len({e.id for e in some}) == 6
    assert [e.id for e in mut.drawn("0", 7, per_run=6)] == [e.id for e in some]
    slow = {(e.notebook, e.stub.grade_id) for s in range(40) for e in mut.drawn("0", s, 6)}
    assert not slow & set(mut.SLOW_CELLS) and len(slow) > 6  # the draws move around
    assert len(mut.drawn("1", 7, per_run=6)) == len(mut.drawn("1", 7)) + 6


def test_each_listed_equivalent_mutant_is_one_the_tool_makes():
    made = {(e.notebook, e.mutant.id) for e in mut.all_mutants()}
    listed = mut.equivalent()
    assert all(why.strip() for why in listed.values())
    stale = sorted(set(listed) - made)
    assert not stale, f"listed as equivalent but no longer made (the solution changed): {stale}"


def test_the_seed_is_the_runs_own_and_the_same_on_every_worker(monkeypatch):
    monkeypatch.delenv("COURSE_MUTANTS_SEED", raising=False)
    monkeypatch.delenv("COURSE_MUTANTS_PER_EXERCISE", raising=False)
    monkeypatch.delenv("COURSE_MUTANTS_PER_RUN", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abc")
    first = mut.selection()
    assert first == mut.selection() and first[:2] == ("0", 0) and not first.any
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abd")
    assert mut.selection().seed != first.seed
    monkeypatch.setenv("COURSE_MUTANTS_SEED", "42")
    monkeypatch.setenv("COURSE_MUTANTS_PER_EXERCISE", "2")
    monkeypatch.setenv("COURSE_MUTANTS_PER_RUN", "5")
    assert mut.selection() == ("2", 5, 42)


def test_the_report_counts_each_exercise_and_lists_what_was_not_killed(tmp_path):
    rows = [("a", "killed", 2.0, False), ("b", "killed", 6.0, True), ("c", "survived", 1.0, False),
            ("d", "timeout", 90.0, True), ("e", "equivalent", 1.0, False)]
    path = tmp_path / "out.jsonl"
    path.write_text("".join(json.dumps(
        {"mutant": f"ex1-solution/delete: {m}", "notebook": "01_collectives.ipynb",
         "exercise": "ex1-solution", "status": s, "seconds": t, "damaged": d}) + "\n"
        for m, s, t, d in rows) + json.dumps(
        {"mutant": "ex1-solution/delete: c", "notebook": "01_collectives.ipynb",
         "exercise": "ex1-solution", "status": "killed", "seconds": 3.0}) + "\n")
    got = report.read(path)  # c's second run replaces its first
    text = report.table(got)
    assert "| 01 | ex1-solution | 5 | 3 | 1 | 0 | 1 | 2 | 3.0 / 6.0 |" in text, text
    gaps = report.not_killed(got)
    assert "delete: d: **timeout, damaged the group**" in gaps
    assert "delete: b: **killed, damaged the group**" in gaps and ": c:" not in gaps
    out = tmp_path / "mutants.md"
    out.write_text("# Mutants\n\nhow to read it\n")
    report.main([str(path), "--out", str(out)])
    report.main([str(path), "--out", str(out)])  # again: the generated part is replaced
    body = out.read_text()
    assert body.startswith("# Mutants\n\nhow to read it") and body.count("## Per exercise") == 1


def test_the_report_updates_one_units_lines_and_keeps_the_others(tmp_path):
    def line(nb, mutant, status, seconds):
        return json.dumps({"mutant": f"ex1-solution/delete: {mutant}", "notebook": nb,
                           "exercise": "ex1-solution", "status": status,
                           "seconds": seconds}) + "\n"

    full, one = tmp_path / "all.jsonl", tmp_path / "one.jsonl"
    full.write_text(line("01_collectives.ipynb", "a", "killed", 40.0)
                    + line("02_data.ipynb", "b", "survived", 1.0)
                    + line("03_ddp.ipynb", "c", "killed", 2.0))
    out = tmp_path / "mutants.md"
    report.main([str(full), "--out", str(out)])
    one.write_text(line("01_collectives.ipynb", "a", "killed", 4.0)
                   + line("01_collectives.ipynb", "z", "equivalent", 1.0))
    report.main([str(one), "--out", str(out), "--update"])
    body = out.read_text()
    assert "| 01 | ex1-solution | 2 | 1 | 1 | 0 | 0 | 0 | 4.0 / 4.0 |" in body, body
    assert "40.0" not in body
    assert "| 03 | ex1-solution | 1 | 1 | 0 | 0 | 0 | 0 | 2.0 / 2.0 |" in body
    assert body.index("| 01 |") < body.index("| 02 |") < body.index("| 03 |")
    assert "| all | | 4 | 2 | 1 | 1 | 0 | 0 | |" in body
    assert "`02` ex1-solution/delete: b: **survived**" in body  # another unit's gap stays
    report.main([str(one), "--out", str(out)])  # without --update: the outcomes alone
    assert "| 02 |" not in out.read_text()
