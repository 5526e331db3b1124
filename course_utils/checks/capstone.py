"""Engine-side probes behind the graded tests of ``09_capstone``: held-out accuracy (on a split
the notebook never loads), equal weights on every rank, and resuming from a checkpoint."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from ..cluster.engines.engine import px_name

#: The capstone's accuracy bar on held-out data, per dataset.
TARGET = {"sklearn-digits": 0.85, "cifar10": 0.30}


def engine_check_capstone(model_name: str = "final_model", data_root: str = "data",
                          n_test: int = 1000) -> dict[str, Any]:
    """*Collective.* Score the learner's model (a plain module or a DDP wrapper) on the held-out
    test split (CIFAR-10's test set or the digits fallback's test split, whichever the course
    data resolves to; never loaded by the notebook), and measure how far the ranks' weights
    are apart. Returns the accuracy, the dataset's name and target, and the weight spread."""
    import torch

    from ..data import cifar10
    from ..torch_dist.train import evaluate, replica_spread

    model = px_name(model_name)
    model = getattr(model, "module", model)
    test = cifar10(data_root, train=False, n=n_test, download=False)
    x = (torch.from_numpy(test.x) - 0.5) / 0.5
    y = torch.from_numpy(test.y)
    device = next(model.parameters()).device
    acc = evaluate(model, x.to(device), y.to(device))["accuracy"]
    return {"accuracy": acc, "data": test.name, "target": TARGET.get(test.name, 0.0),
            "spread": replica_spread(model), "n": len(y)}


def engine_check_resume(fn_name: str = "resume_or_start", folder: str = "/tmp"
                        ) -> dict[str, Any]:
    """*Collective.* Call the learner's ``fn_name(model, optimizer, path)`` twice on a fresh
    model: with no file (expect epoch 0, weights untouched) and with a checkpoint of epoch 5
    written by rank 0 (expect 5, the checkpoint's weights and momentum on every rank)."""
    import torch
    import torch.distributed as dist

    from ..torch_dist.train import flat_params, original_cnn

    fn = px_name(fn_name)
    rank = dist.get_rank()
    path = os.path.join(folder, "capstone-resume-check.pt")
    if rank == 0 and os.path.exists(path):
        os.remove(path)
    dist.barrier()
    fresh = original_cnn(seed=7)
    before = flat_params(fresh).clone()
    none_epoch = fn(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9), path)
    untouched = bool(torch.equal(before, flat_params(fresh)))
    dist.barrier()   # every rank has looked for the file before rank 0 writes it
    saved = original_cnn(seed=11)
    opt = torch.optim.SGD(saved.parameters(), lr=0.1, momentum=0.9)
    saved(torch.zeros(2, 3, 32, 32)).sum().backward()
    opt.step()
    if rank == 0:
        torch.save({"model": saved.state_dict(), "optimizer": opt.state_dict(), "epoch": 5},
                   path)
    dist.barrier()
    model = original_cnn(seed=100 + rank)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    epoch = fn(model, opt2, path)
    diff = float((flat_params(model) - flat_params(saved)).abs().max())
    has_momentum = bool(opt2.state_dict()["state"])
    dist.barrier()
    return {"no_file_epoch": none_epoch, "untouched": untouched, "epoch": epoch,
            "weight_diff": diff, "momentum_restored": has_momentum}


@contextlib.contextmanager
def small_data(per_rank: int, slow_s: float = 0.0, extra: int = 0) -> Iterator[Any]:
    """*Not collective.* Replace the learner's global ``train_set`` for the duration by its first
    ``per_rank · p + extra`` examples in a dataset that records every index read (``.seen``);
    the learner's ``train_set`` comes back afterwards. ``slow_s``: seconds each read sleeps;
    ``extra`` (< p): examples that ``drop_last=True`` leaves out of every epoch."""
    import torch.distributed as dist
    from torch.utils.data import Dataset

    import __main__

    ns = vars(__main__)
    x, y = px_name("train_set").tensors
    n = per_rank * dist.get_world_size() + extra

    class Recording(Dataset):
        def __init__(self) -> None:
            self.seen: list[int] = []

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> Any:
            self.seen.append(int(i))
            if slow_s:
                time.sleep(slow_s)
            return x[i], y[i]

    saved, ns["train_set"] = ns["train_set"], Recording()
    try:
        yield ns["train_set"]
    finally:
        ns["train_set"] = saved


def sampler_order(n: int, epoch: int) -> list[int]:
    """The indices this rank reads in ``epoch`` from ``DistributedSampler(seed=0,
    drop_last=True)`` over ``n`` examples, after ``set_epoch(epoch)``."""
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=dist.get_world_size(),
                                 rank=dist.get_rank(), seed=0, drop_last=True)
    sampler.set_epoch(epoch)
    return list(sampler)


def _fresh_path(path: str) -> None:
    import torch.distributed as dist

    if dist.get_rank() == 0 and os.path.exists(path):
        os.remove(path)
    dist.barrier()


def engine_check_capstone_loop(fn_name: str = "train_capstone", folder: str = "/tmp",
                               per_rank: int = 64) -> dict[str, Any]:
    """*Collective.* Run the learner's ``fn_name(epochs, ckpt_path, budget_s)`` of
    ``09_capstone`` on a small slice of ``train_set`` (``per_rank`` examples per rank and one
    more, read through a recording dataset) with no budget to speak of: 1 epoch from nothing,
    then 2 epochs (it should resume and run only epoch 1), then 2 epochs from nothing again.
    Returns what the graded test asserts: the reads per epoch (``reads``, ``per_epoch``: the
    odd example dropped), the sampler's order per epoch (``sampler_ok``, ``set_epoch``), that
    training moved the weights (``moved``), the resume (``resumed_epochs``, ``resume_diff``
    against the uninterrupted run) and whether the reported ``val_accuracy`` is the model's."""
    import torch.distributed as dist

    from ..torch_dist.train import evaluate, flat_params, original_cnn

    fn = px_name(fn_name)
    path = os.path.join(folder, "capstone-loop-check.pt")
    # one example more than the ranks share evenly: drop_last=True leaves it out
    n, mine = per_rank * dist.get_world_size() + 1, per_rank
    out: dict[str, Any] = {"rank": dist.get_rank()}
    with small_data(per_rank, extra=1) as data:
        _fresh_path(path)
        first = fn(1, path, 1e9)
        data.seen.clear()
        again = fn(2, path, 1e9)
        resumed_reads = list(data.seen)
        resumed = flat_params(px_name("final_model").module)
        _fresh_path(path)
        data.seen.clear()
        full = fn(2, path, 1e9)
        reads = list(data.seen)
        model = px_name("final_model").module
        val = evaluate(model, px_name("val_x").to(next(model.parameters()).device),
                       px_name("val_y").to(next(model.parameters()).device))["accuracy"]
        _fresh_path(path)
    want = [sampler_order(n, e) for e in (0, 1)]
    start = flat_params(original_cnn(seed=0)).to(flat_params(model).device)
    out.update({
        "reads": len(reads), "per_epoch": mine, "first_epochs": [h.get("epoch") for h in first],
        # training happened: two epochs moved the weights from original_cnn(seed=0)'s
        "moved": float((flat_params(model) - start).abs().max()),
        "sampler_ok": reads[:mine] == want[0],
        "set_epoch": reads[:mine] == want[0] and reads[mine:] == want[1],
        "same_order_twice": reads[:mine] == reads[mine:],
        "resumed_epochs": [h.get("epoch") for h in again],
        "resumed_reads_epoch1": resumed_reads == want[1],
        "resume_diff": float((resumed - flat_params(model)).abs().max()),
        "full_epochs": [h.get("epoch") for h in full],
        "val_reported": full[-1].get("val_accuracy") if full else None, "val_model": val,
    })
    return out


@contextlib.contextmanager
def slow_setup(setup_s: float) -> Iterator[None]:
    """*Not collective.* Make the learner's global ``resume_or_start`` sleep ``setup_s`` seconds
    first, for the duration, so that every rank's clock has run that long before its first
    budget check (``09_capstone``, exercise 2)."""
    import __main__

    ns = vars(__main__)
    saved = ns.get("resume_or_start")
    if setup_s <= 0 or saved is None:
        yield
        return

    def resume_or_start(*args: Any, **kwargs: Any) -> Any:
        time.sleep(setup_s)
        return saved(*args, **kwargs)

    ns["resume_or_start"] = resume_or_start
    try:
        yield
    finally:
        ns["resume_or_start"] = saved


def engine_check_capstone_stop(fn_name: str = "train_capstone", folder: str = "/tmp",
                               late_s: float = 2.0, budget_s: float = 1.0,
                               per_rank: int = 64, setup_s: float = 0.0) -> dict[str, Any]:
    """*Collective until the learner's function returns; nothing collective after it.* The last
    rank calls ``fn_name(3, path, budget_s)`` ``late_s`` seconds after the others, so the
    others' clocks read ``late_s`` more: a stop each rank decides from its own clock splits the
    ranks (one leaves, another waits in the next epoch's collective until the process group
    times out). ``setup_s``: seconds every rank's ``resume_or_start`` sleeps first
    (:func:`slow_setup`). Returns this rank's epochs, error and seconds; see
    :func:`check_capstone_stop`."""
    import torch.distributed as dist

    fn = px_name(fn_name)
    rank = dist.get_rank()
    path = os.path.join(folder, "capstone-stop-check.pt")
    with small_data(per_rank), slow_setup(setup_s):
        _fresh_path(path)
        if rank == dist.get_world_size() - 1:
            time.sleep(late_s)
        t0 = time.time()
        try:
            epochs, error = [h.get("epoch") for h in fn(3, path, budget_s)], None
        except Exception as exc:  # the process group's timeout, on the rank left behind
            epochs, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if rank == 0:  # no barrier here: the ranks may have parted
        with contextlib.suppress(OSError):
            os.remove(path)
    return {"rank": rank, "epochs": epochs, "error": error, "seconds": time.time() - t0}


def check_capstone_stop(cluster: Any, fn_name: str = "train_capstone", folder: str = "/tmp",
                        late_s: float = 2.0, budget_s: float = 1.0,
                        group_timeout: float = 5.0, setup_s: float = 1.0) -> dict[str, Any]:
    """*In the kernel* (``09_capstone``, exercise 2). Run :func:`engine_check_capstone_stop`
    twice in a process group whose collectives time out after ``group_timeout`` s (so a rank
    left behind fails in seconds, not minutes), then give the ranks their usual group back:
    first with the last rank ``late_s`` late, then with every rank's set-up taking ``setup_s``
    and a budget of 1.8 ``setup_s``, which no rank's clock has spent at the first check.
    Returns ``same`` (every rank ran the same epochs, no error), ``stopped`` (at most one
    epoch: the ranks that started on time had spent ``late_s`` s, past the budget, by the
    second check at the latest, so a stop that follows the slowest clock ends there),
    ``patient`` (the second run trained at least one epoch: a sum of the clocks, over the
    budget where no clock is, would stop at once), ``per_rank`` and ``message`` (what
    happened and the fix)."""
    from ..torch_dist import process_group

    process_group.stop(cluster)
    # debug "off": under TORCH_DISTRIBUTED_DEBUG=DETAIL, a DDP backward whose peer has left
    # waited past the group's timeout in our runs (torch 2.14, gloo); a plain one timed out.
    process_group.start(cluster, timeout=group_timeout, debug="off")
    wait = late_s + 4 * group_timeout + 60
    try:
        res = cluster.run(engine_check_capstone_stop, fn_name, folder, late_s, budget_s,
                          timeout=wait)
        out = _stop_verdict(res, late_s, budget_s)
        if out["stopped"]:
            calm = cluster.run(engine_check_capstone_stop, fn_name, folder, 0.0,
                               1.8 * setup_s, 64, setup_s, timeout=wait + setup_s)
            out["patient"] = all(r["error"] is None and r["epochs"] for r in calm)
            if not out["patient"]:
                out["message"] = (
                    f"every rank's set-up took {setup_s:g} s and budget_s={1.8 * setup_s:g}, so "
                    "no rank's clock had run out at the first check, yet the ranks ran epochs "
                    f"{[r['epochs'] for r in calm]}: the stop read more than the slowest clock "
                    "(a sum of the clocks?). Fix: dist.all_reduce(elapsed, "
                    "op=dist.ReduceOp.MAX), then stop when elapsed.item() > budget_s")
    finally:
        process_group.stop(cluster)
        process_group.start(cluster)
    return out


def _stop_verdict(res: list[dict[str, Any]], late_s: float, budget_s: float) -> dict[str, Any]:
    """:func:`check_capstone_stop`'s verdict on the run with a late rank."""
    same = all(r["error"] is None and r["epochs"] == res[0]["epochs"] for r in res)
    said = "; ".join(f"rank {r['rank']}: " + (f"ran epochs {r['epochs']} and returned after "
                                             f"{r['seconds']:.1f} s" if r["error"] is None
                                             else f"left behind, {r['error']}") for r in res)
    stopped = same and len(res[0]["epochs"] or []) <= 1
    message = "" if same else (
        f"the ranks did not stop together when rank {res[-1]['rank']} started {late_s:g} s "
        f"late with budget_s={budget_s:g} ({said}): each rank decided from its own clock. "
        "Fix: decide together: elapsed = torch.tensor([time.time() - start]); "
        "dist.all_reduce(elapsed, op=dist.ReduceOp.MAX); stop when elapsed.item() > budget_s")
    if same and not stopped:
        message = (
            f"rank {res[-1]['rank']} started {late_s:g} s late with budget_s={budget_s:g}: the "
            f"others had spent over {late_s:g} s by the second check, yet every rank ran "
            f"epochs {res[0]['epochs']}: the stop followed a clock that had not run out. Fix: "
            "stop by the slowest clock: dist.all_reduce(elapsed, op=dist.ReduceOp.MAX), then "
            "stop when elapsed.item() > budget_s")
    return {"same": same, "stopped": stopped, "patient": False, "per_rank": res,
            "message": message}
