"""Unit 4, exercise 1: each task's address taken from ``rank_map[task index]`` instead of the
rank that hosts the task (right only while the two happen to coincide)."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex1-spec-solution"
BODY = """
return {job: [f"{rank_map[i].addr}:{ports[(job, i)]}" for i, _ in enumerate(ranks)]
        for job, ranks in roles.items()}
"""
FAILS = "ex1-test"
MESSAGE = "rank_map[roles[job][i]].addr"
WITHIN_S = 30
