"""Unit 7, exercise 1: the ring reading written for 2 ranks (alpha = a / 2, beta = b), right
on this cluster and wrong on any other."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
n, t = np.asarray(sizes, float), np.asarray(seconds, float)
b, a = np.polyfit(n, t, 1, w=1.0 / t)
return max(float(a), 0.0) / 2, float(b)
"""
FAILS = "ex1-test"
MESSAGE = "with p=3 ranks"
WITHIN_S = 30
