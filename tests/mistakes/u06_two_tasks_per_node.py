"""Unit 6, exercise 5: two srun tasks per node (one per GPU, as without torchrun): each node
then runs two torchruns, which both want to be that node's agent."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex5-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    "#SBATCH --ntasks-per-node=1",""",
     """\
    "#SBATCH --ntasks-per-node=2","""),
]
FAILS = "ex5-test"
MESSAGE = "one task per node"
WITHIN_S = 30
