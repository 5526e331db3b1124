"""Code in the shape of the official PyTorch tutorials runs in a ``%%px`` cell after
``cu.start_torch()``: real engines, real gloo groups.

The tutorials (and torchrun scripts) build their group from the environment:
``dist.init_process_group("gloo")`` reads ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``
(``env://``), and rank 0 listens on ``MASTER_PORT``. The course's own rendezvous store listens
on a port of its own, and ``MASTER_PORT`` names a second, free one, so rank 0 can listen there
(before, it failed with ``EADDRINUSE`` and rank 1 waited for torch's 30-minute default).

The same cell run a second time right after the first builds its group on the same
``MASTER_PORT`` while a rank may still be leaving the old one, and can hang (rank 0 waiting).
``cu.start_torch()`` before it exports a fresh port: that is what the course says
to do, and what is tested.
"""

from __future__ import annotations

import os

import pytest

CID = f"pytest-tutorial-{os.getpid()}"

#: Exactly what a learner copies from the tutorials into a ``%%px`` cell (``%%px`` runs a
#: cell's code with ``view.execute``, as below).
TUTORIAL_CELL = """
import torch
import torch.distributed as dist

dist.destroy_process_group()
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
tutorial_sum = t.item()
tutorial_rank, tutorial_world = dist.get_rank(), dist.get_world_size()
"""


@pytest.fixture(scope="module")
def cluster():
    import course_utils as cu

    cc = cu.start(n=2, cluster_id=CID)
    yield cc
    cc.stop(force=True)


def _px(cc, code: str, timeout: float = 120) -> None:
    ar = cc.view.execute(code, block=False)
    ar.get(timeout=timeout)  # a rank left waiting fails the test here, not after 30 minutes


def _pulled(cc, *names: str) -> list[tuple]:
    return [tuple(row) for row in cc.view.pull(list(names), block=True)]


def test_a_tutorial_shaped_cell_then_start_torch_again(cluster):
    import course_utils as cu
    from course_utils.torch_dist import process_group

    first = cu.start_torch(cluster)
    assert first["debug"] == "off"  # a plain group: what a script gets
    assert first["master_port"] != first["store_port"]
    _px(cluster, "import os; exported = os.environ['MASTER_PORT'], os.environ['LOCAL_RANK']")
    assert sorted(_pulled(cluster, "exported")) == [((str(first["master_port"]), "0"),),
                                                    ((str(first["master_port"]), "1"),)]

    ports = []
    for run in range(2):  # again after cu.start_torch(), which exports a fresh MASTER_PORT
        info = first if run == 0 else cu.start_torch(cluster)
        ports.append(info["master_port"])
        _px(cluster, TUTORIAL_CELL)
        got = _pulled(cluster, "tutorial_sum", "tutorial_rank", "tutorial_world")
        assert sorted(got) == [(2.0, 0, 2), (2.0, 1, 2)], got
    assert ports[0] != ports[1]

    # the learner's group is not the course's: start_torch builds its own again
    assert cluster.run(process_group._engine_state, timeout=30) == [None, None]
    again = cu.start_torch(cluster)
    assert again["reused"] is False and again["world_size"] == 2
    _px(cluster, "t = torch.ones(3); dist.all_reduce(t); after = t.tolist()")
    assert _pulled(cluster, "after") == [([2.0] * 3,), ([2.0] * 3,)]
    assert cu.start_torch(cluster)["reused"] is True  # and a third call reuses it
