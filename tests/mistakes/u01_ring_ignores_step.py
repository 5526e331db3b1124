"""A ring that ignores the step index: every step sends chunk r and receives chunk r-1
(all-gather: r+1 and r). With 2 ranks each phase has one step, so it passes there; on 3 and 4
ranks the chunks must move with the step."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]""",
     """\
    (a, b), (c, d) = bounds[r], bounds[(r - 1) % p]"""),
    ("""\
    (a, b), (c, d) = bounds[(r + 1 - s) % p], bounds[(r - s) % p]""",
     """\
    (a, b), (c, d) = bounds[(r + 1) % p], bounds[r]"""),
]
FAILS = "ex1-test-correct"
MESSAGE = "The chunk must move with the step"
WITHIN_S = 30
