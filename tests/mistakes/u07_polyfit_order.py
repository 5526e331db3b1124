"""Unit 7, exercise 1: np.polyfit's coefficients read as (intercept, slope); it returns the
slope first."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
n, t = np.asarray(sizes, float), np.asarray(seconds, float)
a, b = np.polyfit(n, t, 1, w=1.0 / t)
a = max(float(a), 0.0)
return a / (2 * (p - 1)), float(b) * p / (2 * (p - 1))
"""
FAILS = "ex1-test"
MESSAGE = "np.polyfit(n, t, 1) returns (slope, intercept)"
WITHIN_S = 30
