"""Unit 11, exercise 2b: a warm-up one forward too long (p - rank instead of p - 1 - rank): the
gradients are right, but each rank keeps one microbatch's activations more than 1F1B needs."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex2b-solution"
REPLACE = [("warmup = min(p - 1 - rank, m)", "warmup = min(p - rank, m)")]
FAILS = "ex2b-test"
MESSAGE = "warm up with p - 1 - rank forwards"
WITHIN_S = 30
