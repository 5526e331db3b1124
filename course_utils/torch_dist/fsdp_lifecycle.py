"""What FSDP does to each layer during one training step, recorded on every rank.

Introduced in ``10_sharding_and_memory``, before the learner builds FSDP by hand: torch's FSDP2
(``fully_shard`` on each Linear of :func:`sharding.mlp`) trains two steps, and the second one's
events are kept in the order they happened on this rank: each all_gather (which layer, forward
or backward, bytes), each layer's computation (forward and backward), the moment its gathered
full weights appear and are freed, and each reduce_scatter of a gradient. Nothing is drawn
here: :func:`course_utils.viz.memory.fsdp_lifecycle` draws what :func:`engine_fsdp_lifecycle`
returns.

How the events are found, without FSDP's internals: the collectives FSDP2 calls
(``dist.all_gather_single``, ``dist.reduce_scatter_single``) are wrapped while the step runs; a
layer's forward hooks see its gathered weight (a plain tensor, not a DTensor) while it runs, and
a hook on its output's gradient marks the start of its backward. Each layer is gathered once in
forward (first to last) and once in backward (last to first), and its gradient reduce-scattered
once (last to first): the k-th call of each kind belongs to the k-th layer in that order. The
full weights' bytes alive are read from their storages at every event (FSDP frees them by
shrinking the storage to zero bytes).
"""

from __future__ import annotations

import contextlib
from typing import Any

from .spies import replaced

#: The event kinds, in the words the figure uses.
KINDS = ("all_gather", "full", "compute", "free", "reduce_scatter")


class LifecycleRecorder:
    """Records the events of one step of an FSDP2 model whose Linear layers are ``layers``."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        self.full: dict[int, list[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.alive: list[int] = []
        self.phase = "forward"
        self.counts = {"all_gather": 0, "reduce_scatter": 0}
        self.held = [0] * len(layers)
        self._spies = contextlib.ExitStack()
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(self._pre(i))
            layer.register_forward_hook(self._post(i))

    def start(self, phase: str) -> None:
        """A new phase (``"forward"`` or ``"backward"``; a step starts with ``"forward"``, which
        forgets the previous step's events): the calls of each kind are counted anew."""
        self.phase = phase
        self.counts = {"all_gather": 0, "reduce_scatter": 0}
        if phase == "forward":
            self.events, self.alive = [], []

    def snapshot(self) -> None:
        """Emit ``full``/``free`` for each layer whose gathered weights appeared or went."""
        now = [sum(t.untyped_storage().nbytes() for t in self.full.get(i, []))
               for i in range(len(self.layers))]
        was, self.held = self.held, now
        for i, (before, after) in enumerate(zip(was, now, strict=True)):
            if after and not before:
                self._emit("full", i, after)
            elif before and not after:
                self._emit("free", i, before)

    def _emit(self, kind: str, layer: int, nbytes: int) -> None:
        self.events.append({"kind": kind, "layer": layer, "phase": self.phase, "bytes": nbytes})
        self.alive.append(sum(self.held))

    def _pre(self, i: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            if not hasattr(module.weight, "to_local"):   # FSDP gathered it: a plain tensor
                self.full[i] = [module.weight, module.bias]
            self.snapshot()
            self._emit("compute", i, 0)
        return hook

    def _post(self, i: int) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            self.snapshot()
            out.register_hook(self._grad_out(i))
        return hook

    def _grad_out(self, i: int) -> Any:
        def hook(grad: Any) -> None:
            self.snapshot()
            self._emit("compute", i, 0)
        return hook

    def _layer_of(self, kind: str) -> int:
        k = self.counts[kind]
        self.counts[kind] += 1
        n = len(self.layers)
        return k if kind == "all_gather" and self.phase == "forward" else n - 1 - k

    def _wrap(self, kind: str, real: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            out = args[0] if args else kwargs["output"]
            inp = args[1] if len(args) > 1 else kwargs["input"]
            self.snapshot()
            big = out if kind == "all_gather" else inp
            self._emit(kind, self._layer_of(kind), big.numel() * big.element_size())
            result = real(*args, **kwargs)
            self.snapshot()
            return result
        return spy

    def __enter__(self) -> LifecycleRecorder:
        kinds = {"all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter"}
        self._spies.enter_context(replaced(lambda name, real: self._wrap(kinds[name], real),
                                           kinds))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._spies.close()


def engine_fsdp_lifecycle(width: int = 64, depth: int = 4, steps: int = 2) -> dict[str, Any]:
    """*Collective.* ``steps`` Adam steps of FSDP2 on :func:`sharding.mlp`; the last step's
    events on this rank (``events``: dicts of ``kind``, ``layer``, ``phase``, ``bytes``; ``alive``:
    the gathered full weights' bytes alive after each event), each layer's full bytes and the
    whole model's."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from .sharding import batches, fsdp2_model

    model = fsdp2_model(width, depth)
    layers = [m for m in model if isinstance(m, nn.Linear)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rec = LifecycleRecorder(layers)
    with rec:
        for x, y in batches(steps):
            rec.start("forward")
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            rec.start("backward")
            loss.backward()
            rec.snapshot()
            opt.step()
    full = [4 * sum(q.numel() for q in m.parameters()) for m in layers]
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "events": rec.events,
            "alive": rec.alive, "layer_bytes": full, "model_bytes": sum(full)}


def summary(record: dict[str, Any]) -> str:
    """One line on a rank's step from :func:`engine_fsdp_lifecycle`: collectives per layer and
    the most full-weight bytes held at once, beside the whole model's."""
    calls = {k: sum(e["kind"] == k for e in record["events"])
             for k in ("all_gather", "reduce_scatter")}
    n = len(record["layer_bytes"])
    return (f"rank {record['rank']}: {calls['all_gather']} all_gathers and "
            f"{calls['reduce_scatter']} reduce_scatters for {n} layers; at most "
            f"{max(record['alive'], default=0):,} B of full weights held at once (largest "
            f"layer {max(record['layer_bytes']):,} B, whole model {record['model_bytes']:,} B)")
