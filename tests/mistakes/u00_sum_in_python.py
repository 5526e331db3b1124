"""Unit 0, exercise 2: the sum computed in plain Python from ``world_size``, with no collective:
the right number on every rank, and nothing learned about collectives."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
return float(sum((r + 1) ** 2 for r in range(world_size)))
"""
FAILS = "ex2-test"
MESSAGE = "a Python formula talks to no rank"
WITHIN_S = 30
