"""NCCL acceptance without a GPU: every collective of the PyTorch scripts and lesson helpers gets
a tensor an NCCL group accepts.

What separates right from wrong on a GPU rank is *where a collective's tensor lives*: a tensor
the code builds from Python numbers without naming a device (``torch.tensor([loss, n])``) is a
host (CPU) tensor, and an NCCL-only group (``init_process_group("nccl")``, the tutorials' shape)
rejects it: ``No backend type associated with device type cpu``. On a CPU-only machine the host
and the training device are the same device, so that mistake is invisible. These tests make
them different with two of torch's own extension points, in real processes on a real gloo
group:

* :class:`HostTensorsOnMeta`, a ``TorchFunctionMode`` (the mechanism ``with torch.device(...)``
  uses), builds every tensor made *from Python data* with no ``device=`` on the ``meta`` device:
  where a GPU rank would make a CPU tensor. Meta tensors carry no values, so such a tensor can
  only go to a collective, never be computed with; the training device stays the CPU.
* :class:`NcclContract`, a ``TorchDispatchMode``, sees every c10d op (``c10d.allreduce_``,
  ``c10d.allgather_``, ``c10d.broadcast_``, ...) with its tensors before the backend does, and
  fails the test for a tensor that is not on the training device or whose dtype NCCL has no
  type for (torch's ``ncclDataType`` map in ``ProcessGroupNCCL.cpp``: int8, uint8, int32,
  int64, float16, float32, float64, bfloat16, bool as uint8, float8; no int16, no unsigned
  16/32/64-bit; complex tensors are viewed as real by ``dist.all_reduce`` before the op).

What the modes cannot see: a tensor made on the host by other means (``torch.from_numpy``,
``.cpu()``, a factory such as ``torch.zeros(n)``) stays on the CPU here. The group itself is
checked apart (:func:`test_the_scripts_group_maps_cpu_tensors_too`): with torch's fake
backend registered for ``cuda`` only, a group built like ``init_process_group("nccl")``
rejects a CPU tensor with NCCL's very message, and the script's ``"cpu:gloo,cuda:nccl"`` takes it.

On the code before this test existed, ``ddp_script.train_steps`` and ``train.reduce_metrics``
fail here ("a host tensor ... reached c10d.allreduce_").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: dtypes with an NCCL data type in torch's ProcessGroupNCCL (see the module docstring).
NCCL_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64", "bfloat16",
               "bool", "float8_e4m3fn", "float8_e5m2")


def _tensors(obj: Any) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _modes(device: str) -> tuple[Any, Any]:
    """The two modes, built here so that importing this file needs no torch."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from_data = {torch.tensor, torch.as_tensor, torch.asarray, torch.scalar_tensor}

    class HostTensorsOnMeta(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func in from_data and kwargs.get("device") is None:
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    class NcclContract(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if func.namespace == "c10d":
                for t in _tensors(list(args)):
                    dtype = str(t.dtype).removeprefix("torch.")
                    if t.device.type == "meta":
                        raise AssertionError(
                            f"a host tensor (made without device=, {dtype} {list(t.shape)}) "
                            f"reached {func}: on a GPU rank it is a CPU tensor, and an NCCL "
                            "group rejects it (No backend type associated with device type "
                            "cpu); make it on the rank's device")
                    if str(t.device) != device:
                        raise AssertionError(f"{func} got a tensor on {t.device}, not {device}")
                    if dtype not in NCCL_DTYPES:
                        raise AssertionError(f"{func} got a {dtype} tensor: NCCL has no such "
                                             "type (ProcessGroupNCCL's ncclDataType)")
                    self.seen.append(f"{func.__name__.split('.')[0]}:{dtype}")
            return func(*args, **(kwargs or {}))

    return HostTensorsOnMeta(), NcclContract()


# ---- one rank: run in a subprocess by the tests below ---------------------------------------
def _train_steps() -> dict[str, Any]:
    import torch

    from course_utils.torch_dist import ddp_script

    res = ddp_script.train_steps(2, batch=8, device=torch.device("cpu"))
    return {"loss": res["loss"], "spread": res["replica_spread"]}


def _helpers() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from course_utils import data
    from course_utils.torch_dist import train

    ds = data.digits()
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    model = train.digits_mlp(0)
    F.cross_entropy(model(x[:32]), y[:32]).backward()
    return {"spread": train.replica_spread(model), "grad_spread": train.grad_spread(model),
            "eval": train.evaluate(model, x, y)["count"],
            "metrics": train.reduce_metrics(3.0, 2, 4)["count"]}


def _rank_main() -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    out: dict[str, Any] = {}
    for name, fn in (("helpers", _helpers), ("train_steps", _train_steps)):
        host, contract = _modes("cpu")
        try:
            with host, contract:
                out[name] = fn()
        except AssertionError as exc:
            out[name] = {"error": str(exc)}
        out[name]["seen"] = sorted(set(contract.seen))
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    """Two real processes on a gloo group (one pair for both tests: each start costs torch's
    import): each runs the lesson helpers, then ddp_script's training steps, under the modes."""
    from course_utils.cluster import ports

    world = 2
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": str(world),
           "MASTER_PORT": str(ports.free_port()), "COURSE_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, __file__], cwd=ROOT, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    results = []
    for r, text in enumerate(outs):
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"rank {r} printed no result:\n{text[-3000:]}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def test_ddp_scripts_training_steps_send_nccl_tensors_only(two_ranks):
    for r in (res["train_steps"] for res in two_ranks):
        assert "error" not in r, r["error"]
        assert r["spread"] == 0.0 and r["loss"] == r["loss"]  # replicas equal, loss a number
        # DDP's gradient buckets, the replica check and the reduced metrics were all checked
        assert {"allreduce_:float32", "allreduce_:float64", "allgather_:float64"} <= set(r["seen"])


def test_lesson_helpers_collectives_send_nccl_tensors_only(two_ranks):
    for r in (res["helpers"] for res in two_ranks):
        assert "error" not in r, r["error"]
        assert r["metrics"] == 8 and r["eval"] > 0 and r["spread"] == 0.0
        assert {"allreduce_:float64", "allgather_:float64"} <= set(r["seen"])


def test_the_contract_catches_a_host_tensor_in_this_process():
    """The modes themselves: a tensor from Python numbers, sent as is, is refused; the same
    numbers on the training device pass. A world of one, so it needs no second process."""
    import datetime

    import torch
    import torch.distributed as dist

    from course_utils.cluster import ports

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports.free_port()}",
                            rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        host, contract = _modes("cpu")
        with host, contract:
            ok = torch.tensor([1.0, 2.0], device="cpu")
            dist.all_reduce(ok)
            with pytest.raises(AssertionError, match="host tensor"):
                dist.all_reduce(torch.tensor([1.0, 2.0]))
            with pytest.raises(AssertionError, match="NCCL has no such type"):
                dist.all_reduce(torch.ones(2, dtype=torch.int16))
        assert contract.seen == ["allreduce_:float32"]
    finally:
        dist.destroy_process_group()


def test_the_scripts_group_maps_cpu_tensors_too():
    """torch's fake backend registered for ``cuda`` only stands for NCCL: a group built as
    ``init_process_group("nccl")`` has no backend for a CPU tensor (torch's real dispatch by
    device type), the script's mapped string gives it gloo."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup

    from course_utils.cluster import ports
    from course_utils.torch_dist import ddp_script

    name = "ncclstandin"
    if not hasattr(dist.Backend, name.upper()):
        dist.Backend.register_backend(
            name, lambda common, opts: FakeProcessGroup._create_internal(
                common.group_rank, common.group_size, opts),
            extended_api=True, devices=["cuda"])
    mapped = ddp_script.group_backend("nccl")
    assert mapped == "cpu:gloo,cuda:nccl" and ddp_script.group_backend("gloo") == "gloo"
    for backend, accepts_cpu in ((mapped.replace("nccl", name), True), (name, False)):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{ports.free_port()}",
                                rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
        try:
            t = torch.ones(2, dtype=torch.float64)
            if accepts_cpu:
                dist.all_reduce(t)
                assert t.tolist() == [1.0, 1.0]
            else:
                with pytest.raises(RuntimeError, match="No backend type associated with device "
                                                       "type cpu"):
                    dist.all_reduce(t)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main()
