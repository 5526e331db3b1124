"""Unit 11, exercise 2b: 1F1B with blocking sends, as GPipe had them: rank r sends its next
activation while rank r+1 sends it a gradient, and on gloo each send waits for the other's
recv: a deadlock, named when gloo's timeout ends it."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex2b-solution"
REPLACE = [("sends.append(dist.isend(y.detach(), rank + 1))", "dist.send(y.detach(), rank + 1)"),
           ("sends.append(dist.isend(x.grad, rank - 1))", "dist.send(x.grad, rank - 1)")]
FAILS = "ex2b-test"
MESSAGE = "Send with dist.isend"
WITHIN_S = 30
