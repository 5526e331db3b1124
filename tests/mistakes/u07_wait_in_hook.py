"""Unit 7, exercise 2: work.wait() right after each launch inside the hook, so nothing overlaps."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 1
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    self._launch()""",
     """\
    self._launch()
    self.pending[-1][0].wait()"""),
]
FAILS = "ex2-test"
MESSAGE = "wait only in sync()"
WITHIN_S = 30
