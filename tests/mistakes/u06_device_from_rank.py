"""Unit 6, exercise 3: the GPU picked by the global rank (cuda:RANK). On one host RANK equals
LOCAL_RANK and the script runs; on a second host rank 2 asks for GPU 2 of a 2-GPU host."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex3-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
        return torch.device("cuda", int(env["LOCAL_RANK"]))  # GPUs are numbered per host""",
     """\
        return torch.device(f"cuda:{env['RANK']}")"""),
]
FAILS = "ex3-test"
MESSAGE = "pick the GPU by LOCAL_RANK, not RANK"
WITHIN_S = 30
