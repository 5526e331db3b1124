"""The live training view's engine side: a DDP run that logs every step and publishes the rows
to the kernel while it trains (ipyparallel's ``datapub``); :func:`course_utils.viz.watch` draws
them as they arrive. Introduced in ``03_pytorch_ddp``.

:func:`engine_train_live` runs on the engines (``cluster.run``) and is *collective*;
:func:`start_train_live` runs in the kernel.
"""

from __future__ import annotations

import time
from typing import Any

from ..cluster import CourseCluster, current


class LiveLog:
    """Per-step metrics of a training loop on an engine, kept in a list and published to the
    kernel while the loop runs (ipyparallel's ``datapub``), at most ``max_hz`` times a second.

    ``course_utils.viz.live.watch`` draws them from the kernel as they arrive; afterwards
    ``cluster.pull`` of the variable holding the log gives its ``rows``. Introduced in
    ``03_pytorch_ddp``.
    """

    def __init__(self, max_hz: float = 4.0) -> None:
        self.rows: list[dict[str, float]] = []
        self.min_interval = 1.0 / max_hz if max_hz > 0 else 0.0
        self._last = 0.0
        self._t0 = time.perf_counter()
        self._published = 0

    def log(self, **metrics: float) -> None:
        """Append one step's metrics (``time`` since the log began is added); publish the
        rows not yet sent when the last publication is older than ``1/max_hz`` s."""
        row = {k: float(v) for k, v in metrics.items()}
        row.setdefault("time", time.perf_counter() - self._t0)
        self.rows.append(row)
        now = time.perf_counter()
        if now - self._last >= self.min_interval:
            self.flush()
            self._last = now

    def flush(self) -> None:
        """Publish every row logged so far (the kernel keeps the newest publication)."""
        try:
            from ipyparallel.datapub import publish_data

            publish_data({"course_live": list(self.rows)})
            self._published = len(self.rows)
        except Exception:  # not inside an ipyparallel engine: the rows stay pullable
            pass


def engine_train_live(steps: int = 60, batch: int = 64, lr: float = 0.1, hidden: int = 64,
                      max_hz: float = 4.0, delay: float = 0.0) -> list[dict[str, float]]:
    """*Collective.* A small DDP run on this rank's shard of the digits that logs every step to
    a :class:`LiveLog` (loss, step time, samples/s); returns the rows. ``delay`` seconds of sleep
    per step make a short run last long enough to watch."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..data import digits
    from .train import digits_mlp, step_batches

    rank, p = dist.get_rank(), dist.get_world_size()
    ds = digits()
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    model = DDP(digits_mlp(0, hidden))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    live = LiveLog(max_hz=max_hz)
    for s, idx in enumerate(step_batches(len(ds), rank, p, batch, steps)):
        t0 = time.perf_counter()
        ii = torch.from_numpy(idx)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[ii]), y[ii])
        loss.backward()
        opt.step()
        if delay:
            time.sleep(delay)
        dt = time.perf_counter() - t0
        live.log(step=s, loss=float(loss), step_time=dt, samples_per_s=len(ii) / dt)
    live.flush()
    return live.rows


def start_train_live(steps: int = 60, delay: float | None = None,
                     cluster: CourseCluster | None = None, **kwargs: Any) -> Any:
    """Start :func:`engine_train_live` on every rank *without waiting* and return its
    ``AsyncResult`` (ranks in order) for :func:`course_utils.viz.watch`, which draws the rows
    while the ranks train. ``delay`` (s of sleep per step) defaults to 0.05 where the figure can
    update in place, so a short run lasts long enough to watch, and to 0 where it cannot (nbval,
    scripts). ``kwargs`` go to :func:`engine_train_live`. Introduced in ``03_pytorch_ddp``."""
    from ..viz.live import live_possible

    cc = cluster or current()
    if delay is None:
        delay = 0.05 if live_possible() else 0.0
    return cc.client[cc.ranks.engine_ids].apply_async(engine_train_live, steps, delay=delay,
                                                      **kwargs)
