"""viz.pictures: the learner's own cluster and data-parallel step, rendered headless; every label
comes from the data passed in (rank map dicts, shard sizes)."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from matplotlib.text import Text  # noqa: E402

from course_utils import viz  # noqa: E402
from course_utils.cluster.ranks import build_rank_map  # noqa: E402
from course_utils.viz.pictures import device_label  # noqa: E402


def texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(Text))


def render(fig, tmp_path, name: str) -> int:
    import matplotlib.pyplot as plt

    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=60)
    plt.close(fig)
    return path.stat().st_size


def two_host_ranks() -> list[dict]:
    """The workshop's layout from the real rank-map code: 2 hosts, 2 GPUs each."""
    desc = {eid: {"host": host, "addr": addr, "pid": 900 + eid, "gpus": 2}
            for eid, (host, addr) in enumerate([("gpu-b", "10.0.0.2"), ("gpu-a", "10.0.0.1"),
                                                ("gpu-b", "10.0.0.2"), ("gpu-a", "10.0.0.1")])}
    return build_rank_map(desc, host_order=["gpu-a", "gpu-b"]).to_dicts()


def test_cluster_picture_one_host(tmp_path):
    ranks = build_rank_map({3: {"host": "laptop", "addr": "127.0.0.1", "pid": 41, "gpus": 0},
                            5: {"host": "laptop", "addr": "127.0.0.1", "pid": 42, "gpus": 0}},
                           local=True).to_dicts()
    fig = viz.cluster_picture(ranks)
    t = texts(fig)
    for want in ("host laptop", "kernel", "controller", "rank 0", "rank 1", "local rank 1",
                 "engine 3, pid 41", "engine 5, pid 42", "CPU (no GPU)", "2 ranks on 1 host",
                 "master address 127.0.0.1"):
        assert want in t, (want, t)
    assert render(fig, tmp_path, "one") > 5000


def test_cluster_picture_two_hosts_with_gpus(tmp_path):
    ranks = two_host_ranks()
    fig = viz.cluster_picture(ranks, backend="nccl")
    t = texts(fig)
    assert "host gpu-a  (10.0.0.1)" in t and "host gpu-b  (10.0.0.2)" in t
    assert "4 ranks on 2 hosts, backend nccl" in t
    # ranks 0-1 on gpu-a (engines 1, 3), ranks 2-3 on gpu-b; local rank picks the GPU
    assert "rank 2\nlocal rank 0\nengine 0, pid 900\nGPU 0 (of 2)" in t
    assert "rank 1\nlocal rank 1\nengine 3, pid 903\nGPU 1 (of 2)" in t
    assert t.count("kernel") == 1 and t.count("controller\n") == 1
    assert render(fig, tmp_path, "two") > 5000


def test_cluster_picture_places_the_kernel_where_told():
    fig = viz.cluster_picture(two_host_ranks(), kernel_host="laptop", controller_host="gpu-a")
    assert "host laptop" in texts(fig)   # a host without engines still gets its box
    with pytest.raises(ValueError):
        viz.cluster_picture([])


def test_device_label():
    assert device_label(0, 0) == "CPU (no GPU)"
    assert device_label(2, 1) == "GPU 1 (of 2)"
    assert device_label(1, 1) == "CPU (1 GPUs, none used)"
    assert device_label(2, 0, backend="gloo").startswith("CPU")


def test_data_parallel_picture_shows_this_runs_numbers(tmp_path):
    fig = viz.data_parallel_picture([449, 449, 449, 449], 32, n_examples=1797, lr=0.5)
    t = texts(fig)
    for want in ("rank 3: shard of\n449 examples", "batch of 32", "gradient g3",
                 "/ 4", "1797 examples -> 4 shards, 1796 used", "1 dropped", "lr 0.5",
                 "same on every rank"):
        assert want in t, (want, t)
    assert render(fig, tmp_path, "dp") > 5000
    with pytest.raises(ValueError):
        viz.data_parallel_picture([], 32)
