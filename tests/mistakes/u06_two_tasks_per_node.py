"""Unit 6, exercise 5: two srun tasks per node (one per GPU, as without torchrun): each node
then runs two torchruns, which both want to be that node's agent."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex5-solution"
BODY = """
SBATCH_LINES = [
    "#SBATCH --nodes=2",
    "#SBATCH --ntasks-per-node=2",
    'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node "$NPROC_PER_NODE" '
    '--rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID" train_ddp.py',
]
"""
FAILS = "ex5-test"
MESSAGE = "one task per node"
WITHIN_S = 30
