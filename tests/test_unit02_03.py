"""Units 2 and 3 without engines: the oracle of unit 2's graded test checked against a step
computed by hand, the sampler picture's data, the checkpoint written as if from a GPU.

What needs engines (the graded checks on 2 and 3 ranks, the planted mistakes) is in
the mistakes catalogue (``tests/notebook_items``, inside the notebooks' own runs).
"""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from course_utils import data, train, viz  # noqa: E402


def _one_sgd_step_by_hand(w1, b1, w2, b2, x, y, lr):
    """One SGD step of tanh MLP + softmax cross-entropy, the gradient in closed form (no
    autograd): dL/dz = (softmax(z) - onehot(y)) / B, then the chain rule through both layers."""
    h = np.tanh(x @ w1.T + b1)
    z = h @ w2.T + b2
    e = np.exp(z - z.max(axis=1, keepdims=True))
    dz = (e / e.sum(axis=1, keepdims=True) - np.eye(10)[y]) / len(y)
    dh = (dz @ w2) * (1.0 - h ** 2)
    grads = [dh.T @ x, dh.sum(0), dz.T @ h, dz.sum(0)]
    return [w - lr * g for w, g in zip((w1, b1, w2, b2), grads, strict=True)]


@pytest.mark.parametrize("world_size,batch,lr", [(2, 4, 0.5), (3, 5, 0.2)])
def test_reference_sgd_takes_the_step_computed_by_hand(world_size, batch, lr):
    ds = data.digits()
    # the first step's full batch, from the shared permutation: the first p*B items (drop_last
    # keeps them all; their order does not change a mean gradient)
    rows = np.random.default_rng(0).permutation(len(ds))[: world_size * batch]
    start = [t.detach().double().numpy() for t in train.digits_mlp(0).parameters()]
    expected = _one_sgd_step_by_hand(*start, ds.x[rows].astype(np.float64), ds.y[rows], lr)
    got = train.reference_sgd(1, lr, batch, world_size, seed=0, init_seed=0)
    want = np.concatenate([w.reshape(-1) for w in expected])
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-6
    # and the step is not a no-op: the hand-computed update is what was applied
    w0 = np.concatenate([w.reshape(-1) for w in start])
    assert np.abs(want - w0).max() > 1e-3


def test_a_checkpoint_saved_as_if_on_a_gpu_needs_map_location(tmp_path):
    import torch

    from course_utils import checks

    path = str(tmp_path / "ckpt.pt")
    state = {"model": {"w": torch.arange(3.0)}, "epoch": 2}
    checks.save_as_if_on(state, path, "cuda:7")
    with pytest.raises(RuntimeError, match="CUDA"):   # torch's own refusal: no such GPU here
        torch.load(path, weights_only=True)
    back = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    assert torch.equal(back["model"]["w"], torch.arange(3.0)) and back["epoch"] == 2
    # only that call was tagged: an ordinary save loads anywhere, as before
    torch.save(state, path)
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.arange(3.0))


def _sampler_orders(n, p, epochs, **kw):
    from torch.utils.data.distributed import DistributedSampler

    out = [{} for _ in range(p)]
    for r in range(p):
        for name, drop in (("drop_last=True", True), ("drop_last=False", False)):
            out[r][name] = {}
            for e in epochs:
                s = DistributedSampler(list(range(n)), num_replicas=p, rank=r, shuffle=True,
                                       seed=0, drop_last=drop, **kw)
                s.set_epoch(e)
                out[r][name][str(e)] = list(s)   # epochs as strings: as pulled from engines
    return out


def test_sampler_counts_show_padding_dropping_and_reshuffling():
    n, p = 11, 2
    table = viz.sampler_counts(_sampler_orders(n, p, (0, 1, 2)), n)
    assert sorted(table) == ["drop_last=False", "drop_last=True"]
    for e in (0, 1, 2):
        dropped, padded = table["drop_last=True"][e], table["drop_last=False"][e]
        # drop_last: disjoint equal shards of 5, one item no rank gets
        assert dropped.max() == 1 and list(dropped.sum(axis=1)) == [5, 5]
        assert (dropped.sum(axis=0) == 0).sum() == 1
        # padding: every item drawn, 12 draws for 11 items: exactly one item twice
        assert (padded.sum(axis=0) >= 1).all() and padded.sum() == 12
        assert sorted(padded.sum(axis=0))[-1] == 2
    # set_epoch: rank 0's items differ between epochs 0 and 1
    assert not np.array_equal(table["drop_last=True"][0][0], table["drop_last=True"][1][0])
    with pytest.raises(ValueError, match="outside"):
        viz.sampler_counts([{"v": {0: [11]}}], n)


def test_sampler_epochs_draws_one_panel_per_variant_and_epoch():
    import matplotlib.pyplot as plt

    fig = viz.sampler_epochs(_sampler_orders(11, 3, (0, 1)), 11)
    assert len(fig.axes) == 4
    assert [ax.get_title() for ax in fig.axes[:2]] == ["drop_last=True\nepoch 0",
                                                        "drop_last=True\nepoch 1"]
    assert fig.axes[0].get_yticklabels()[2].get_text() == "rank 2"
    plt.close(fig)


def _dp(rank, p=3, model="mlp", **kw):
    base = {"rank": rank, "world_size": p, "model": model, "error": None, "step1": "right",
            "step2": "right", "losses": [1.0, 0.9], "reference_losses": [1.0, 0.9],
            "loss_types": ["float", "float"]}
    return {**base, **kw}


def test_dp_step_problem_names_a_typed_2_and_a_frozen_parameter():
    from course_utils import checks

    halved = checks.dp_step_problem([_dp(r, step1="halved") for r in range(3)])
    assert "3/2 times" in halved and "never by a number you typed" in halved
    none = ("TypeError: Invalid function argument. Expected parameter `tensor` of type "
            "torch.Tensor but got <class 'NoneType'> instead.")
    frozen = checks.dp_step_problem([_dp(r, 2, "frozen_tied", error=none) for r in range(2)])
    assert "frozen layer" in frozen and "skip a parameter whose .grad is None" in frozen
    # the same error on the plain model says no more than "read the error"
    plain = checks.dp_step_problem([_dp(r, 2, error=none) for r in range(2)])
    assert "skip a parameter" not in plain and "read the error" in plain


def test_the_frozen_tied_model_lists_its_tied_weight_once_and_freezes_a_layer():
    from course_utils.checks.data_parallel import frozen_tied_mlp

    m = frozen_tied_mlp(0)
    assert m[2].weight is m[4].weight
    params = list(m.parameters())
    assert len(params) == 7   # 2 frozen + mid (w, b) + again's bias + last (w, b)
    assert [q.requires_grad for q in params[:2]] == [False, False]
