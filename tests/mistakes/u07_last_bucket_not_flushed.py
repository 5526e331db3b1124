"""Unit 7, exercise 2: sync() waits for the launched buckets but never launches the last,
partial one, so its gradients are never all-reduced."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 2
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
if self.bucket:
    self._launch()""",
     """\
"""),
    ("""\
self.pending = []""",
     """\
self.pending = []
self.bucket, self.bucket_bytes = [], 0"""),
]
FAILS = "ex2-test"
MESSAGE = "launch the last, partial bucket first"
WITHIN_S = 30
