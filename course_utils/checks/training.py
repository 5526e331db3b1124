"""Engine-side probes behind the graded tests of ``03_pytorch_ddp``."""

from __future__ import annotations

from typing import Any

from ..cluster.engines.engine import px_name


def engine_check_checkpoint(fn_name: str, path: str, model_name: str = "ddp_model",
                            opt_name: str = "optimizer", epoch: int = 7,
                            delay: float = 0.5) -> dict[str, Any]:
    """*Collective.* Run the ``%%px`` function ``fn_name(model, opt, epoch, path)`` while
    ``torch.save`` is spied on, and report what each rank saw. Used by the tests of
    ``03_pytorch_ddp``.

    Rank 0's saves are slowed by ``delay`` seconds, so a rank that returns before rank 0 has
    finished (a missing barrier) finds no file. Returned per rank: the paths ``torch.save``
    was called with, whether ``path`` existed when the function returned, the saved keys, the
    saved epoch, the model keys' prefixes and any leftover temporary files.
    """
    import os
    import time

    import torch
    import torch.distributed as dist

    import __main__

    ns = vars(__main__)
    for name in (fn_name, model_name, opt_name):
        px_name(name)
    rank = dist.get_rank()
    if rank == 0 and os.path.exists(path):
        os.remove(path)
    dist.barrier()

    calls: list[str] = []
    real_save = torch.save

    def spy(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else repr(f))
        if rank == 0:
            time.sleep(delay)
        return real_save(obj, f, *args, **kwargs)

    torch.save = spy
    try:
        ns[fn_name](ns[model_name], ns[opt_name], epoch, path)
    finally:
        torch.save = real_save
    exists = os.path.exists(path)
    state = torch.load(path, map_location="cpu", weights_only=False) if exists else {}
    folder, base = os.path.split(os.path.abspath(path))
    leftovers = sorted(f for f in os.listdir(folder) if f != base and base in f)
    dist.barrier()
    model_state = state.get("model", {}) if isinstance(state, dict) else {}
    return {
        "calls": calls,
        "exists_on_return": exists,
        "keys": sorted(state) if isinstance(state, dict) else [],
        "epoch": state.get("epoch") if isinstance(state, dict) else None,
        "module_prefixed": any(str(k).startswith("module.") for k in model_state),
        "n_model_keys": len(model_state),
        "leftovers": leftovers,
    }



def engine_check_sampler(fn_name: str = "make_sampler", n: int = 101,
                         epochs: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """Call the ``%%px`` function ``fn_name(dataset, epoch)`` on a dataset of ``n`` items (odd by
    default, so padding shows) for each epoch; report this rank's order per epoch, the
    sampler's type, ``drop_last``, ``shuffle`` and ``num_replicas``; ``error`` is the first
    line of what the function raised (then nothing else is filled in). Used by exercise 1 of
    ``03_pytorch_ddp``."""

    fn = px_name(fn_name, to_call=True)
    dataset = list(range(n))
    try:
        samplers = {e: fn(dataset, e) for e in epochs}
    except (ValueError, RuntimeError, TypeError) as exc:  # e.g. rank >= a typed num_replicas
        said = " ".join(str(exc).split())[:300]
        return {"n": n, "error": f"{type(exc).__name__}: {said}", "orders": {}, "type": None,
                "drop_last": None, "shuffle": None, "num_replicas": None, "epoch": {}}
    first = samplers[epochs[0]]
    return {
        "n": n,
        "error": None,
        "orders": {e: [int(i) for i in s] for e, s in samplers.items()},
        "type": type(first).__name__,
        "drop_last": getattr(first, "drop_last", None),
        "shuffle": getattr(first, "shuffle", None),
        "num_replicas": getattr(first, "num_replicas", None),
        "epoch": {e: getattr(s, "epoch", None) for e, s in samplers.items()},
    }



def engine_check_ddp(fn_name: str = "wrap_ddp", x_name: str = "X",
                     y_name: str = "Y") -> dict[str, Any]:
    """*Collective.* Wrap differently initialised models with the ``%%px`` function
    ``fn_name(model)``, run one backward pass on different data per rank, and compare with the
    gradients averaged by hand. Used by exercise 2 of ``03_pytorch_ddp``.

    Returns ``error`` (the first line of what wrapping raised, else ``None``), whether the
    result is a DDP module, the weights' spread across ranks right after wrapping, the
    gradients' spread after backward, and the largest difference from the manual average.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import __main__

    from ..torch_dist import train

    ns = vars(__main__)
    for name in (fn_name, x_name, y_name):
        px_name(name)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = ns.get("device", torch.device("cpu"))
    X, Y = ns[x_name], ns[y_name]
    error = None
    try:
        ddp = ns[fn_name](train.original_cnn(seed=100 + rank))
    except (ValueError, RuntimeError, AssertionError) as exc:
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, error)
    if any(errors):  # every rank stops here together: no rank waits in a collective alone
        return {"error": error or next(e for e in errors if e), "is_ddp": False,
                "param_spread": None, "grad_spread": None, "vs_manual": None, "moved": None}
    inner = ddp.module if isinstance(ddp, DDP) else ddp
    start_spread = train.replica_spread(inner)
    batch = torch.arange(8 * rank, 8 * rank + 8)
    ddp.zero_grad()
    F.cross_entropy(ddp(X[batch].to(device)), Y[batch].to(device)).backward()
    plain = train.original_cnn(seed=100).to(device)
    F.cross_entropy(plain(X[batch].to(device)), Y[batch].to(device)).backward()
    expected = train.flat_grads(plain)
    dist.all_reduce(expected)
    expected /= world
    moved = _moves_to_device(ns, fn_name) if isinstance(ddp, DDP) else None
    return {"error": None, "is_ddp": isinstance(ddp, DDP), "param_spread": start_spread,
            "grad_spread": train.grad_spread(inner),
            "vs_manual": float((train.flat_grads(inner) - expected).abs().max()), "moved": moved,
            "gpu_branch": _gpu_branch(ns, fn_name) if isinstance(ddp, DDP) else None}


def _gpu_branch(ns: dict[str, Any], fn_name: str) -> str | None:
    """What ``fn_name(model)`` does when ``device`` is a GPU, seen on any machine: ``None`` when
    it returns what ``DDP(model, device_ids=[device.index])`` returned, else what differed.

    ``device`` is set to ``cuda:1`` and the name ``DDP`` in the learner's namespace to a
    recorder (torch's class is untouched); the model's ``to`` only records, so no GPU is needed.
    A function that spells DDP otherwise reaches the real class, which refuses ``device_ids``
    for a CPU model and names the ids it got in its message: that is accepted when they are
    ``[1]``."""
    import torch

    class Recorded:
        pass

    calls: list[tuple[tuple, dict]] = []
    made = Recorded()

    def recorder(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return made

    class Model(torch.nn.Linear):
        went: list[Any] = []

        def to(self, *args: Any, **kwargs: Any) -> Any:  # records, moves nothing
            self.went.append(args[0] if args else kwargs.get("device"))
            return self

    saved = {k: ns.get(k) for k in ("device", "DDP")}
    ns["device"], ns["DDP"] = torch.device("cuda", 1), recorder
    model = Model(2, 2)
    try:
        got = ns[fn_name](model)
    except (RuntimeError, ValueError) as exc:
        return None if "device_ids [1]" in str(exc) else f"it raised {type(exc).__name__}: {exc}"
    finally:
        for k, v in saved.items():
            ns.pop(k) if v is None else ns.__setitem__(k, v)
    if not calls:
        return "it never called DDP(...)"
    _, kwargs = calls[-1]
    if kwargs.get("device_ids") != [1]:
        return f"DDP got device_ids={kwargs.get('device_ids')!r}"
    if got is not made:
        return f"it returned {type(got).__name__}, not the DDP module"
    return None


def _moves_to_device(ns: dict[str, Any], fn_name: str) -> bool:
    """*Collective* (when the learner's function is). Whether ``fn_name(model)`` moves the model
    to ``device``, seen on a CPU-only machine too: the call runs with ``device`` set to torch's
    ``meta`` device (tensors with a shape and no data), so a moved model's parameters are on
    ``meta`` afterwards (``Module.to`` moves in place) and one never moved is still on the CPU.
    DDP refuses a meta model before it communicates (its parameter check runs on the meta
    device and fails on every rank alike), so that error is expected and dropped."""
    import torch

    from ..torch_dist import train

    saved = ns.get("device")
    model = train.original_cnn(seed=0)
    ns["device"] = torch.device("meta")
    try:
        ns[fn_name](model)
    except (RuntimeError, ValueError, NotImplementedError):
        pass
    finally:
        ns["device"] = saved
    return next(model.parameters()).device.type == "meta"


#: While non-empty, the location :func:`save_as_if_on` has CPU storages tagged with.
_TAG: list[str] = []
_REGISTERED: list[bool] = []


def _tag_elsewhere(storage: Any) -> str | None:
    return _TAG[0] if _TAG and storage.device.type == "cpu" else None


def _leave_to_torch(storage: Any, location: str) -> None:
    return None  # loading is torch's own: cpu/cuda deserializers decide


def save_as_if_on(obj: Any, path: str, location: str) -> None:
    """``torch.save(obj, path)`` of CPU tensors, the file saying they were on ``location``
    (e.g. ``"cuda:1"``): what a checkpoint written by a rank on its GPU looks like, made on a
    machine without one. It uses torch's public ``torch.serialization.register_package`` (a
    tagger asked first, at priority 9, only while this call saves); loading is left to torch,
    which puts each tensor back on the saved location unless ``map_location`` says otherwise.
    Used by exercise 4 of ``03_pytorch_ddp``."""
    import torch

    if not _REGISTERED:
        torch.serialization.register_package(9, _tag_elsewhere, _leave_to_torch)
        _REGISTERED.append(True)
    _TAG.append(location)
    try:
        torch.save(obj, path)
    finally:
        _TAG.clear()


def engine_check_load(fn_name: str, folder: str, epoch: int = 5) -> dict[str, Any]:
    """Not collective. Call the ``%%px`` function ``fn_name(path, model, optimizer)`` on a
    checkpoint that says its tensors were on a GPU this engine does not have
    (:func:`save_as_if_on` with ``cuda:K``, K the number of GPUs it sees, at least 1), with a
    fresh model and optimizer on ``device``. Without ``map_location`` torch tries to put the
    tensors back on that GPU and refuses, on a CPU-only machine too. Returns the error (first
    line), the returned epoch and whether the weights and the momentum were restored. Used by
    exercise 4 of ``03_pytorch_ddp``."""
    import os

    import torch
    import torch.distributed as dist

    from ..cluster.engines.engine import px_name
    from ..torch_dist import train

    fn = px_name(fn_name)
    device = px_name("device")
    src = train.original_cnn(seed=1)
    src_opt = torch.optim.SGD(src.parameters(), lr=0.05, momentum=0.9)
    src(torch.ones(2, 3, 32, 32)).square().mean().backward()
    src_opt.step()  # now the optimizer holds momentum buffers
    location = f"cuda:{max(torch.cuda.device_count(), 1)}"
    path = os.path.join(folder, f"exercise4-rank{dist.get_rank()}.pt")
    save_as_if_on({"model": src.state_dict(), "optimizer": src_opt.state_dict(),
                   "epoch": epoch}, path, location)
    model = train.original_cnn(seed=2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    error, got = None, None
    try:
        got = fn(path, model, opt)
    except Exception as exc:
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
    finally:
        os.remove(path)
    buffers = [opt.state.get(q, {}).get("momentum_buffer") for q in model.parameters()]
    wanted = [src_opt.state[q]["momentum_buffer"] for q in src.parameters()]
    return {"error": error, "epoch": got, "location": location,
            "weights": bool(torch.equal(train.flat_params(model).cpu(), train.flat_params(src))),
            "momentum": all(b is not None and torch.equal(b.cpu(), w)
                            for b, w in zip(buffers, wanted, strict=True))}
