"""Unit 6, exercise 4: --nnodes 1 on a two-node job: each node would form a job of its own."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex4-solution"
BODY = """
TORCHRUN_LINE = ("torchrun --nnodes 1 --nproc-per-node $NPROC_PER_NODE --rdzv-backend c10d "
                 "--rdzv-endpoint $RDZV_ENDPOINT --rdzv-id unit6 --local-addr $NODE_ADDR "
                 "--rdzv-conf is_host=$IS_HOST --max-restarts 0 train_ddp.py")
"""
FAILS = "ex4-test"
MESSAGE = "--nnodes 2 on every node"
WITHIN_S = 30
