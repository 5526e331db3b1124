"""A live training view: one figure, updated in place while the ranks train (units 3 and 5).

The engines log each step with :class:`course_utils.torch_dist.live_log.LiveLog`, which publishes
the rows through ipyparallel's ``datapub`` at most a few times a second; :func:`watch` polls the
running task's ``AsyncResult.data`` from the kernel and redraws **one** figure (loss per rank,
step time per rank, samples/s of all ranks together) at most ``max_hz`` times a second. In unit 5
the coordinator's loop runs in the kernel and calls :meth:`LiveFigure.log` itself.

Where nothing can update in place (nbval, ``IPP_NONINTERACTIVE=1``, a script, ``COURSE_LIVE=0``)
the same calls draw one static figure at the end. :func:`live_training` is the pure figure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..settings import ENV_LIVE, env
from .style import ROLE, pyplot, rank_color, styled

Rows = Sequence[Mapping[str, float]]


def live_possible() -> bool:
    """True in a Jupyter kernel where figures can be replaced in place; False under nbval's
    environment (``IPP_NONINTERACTIVE=1``), in scripts, or with ``COURSE_LIVE=0``."""
    if env(ENV_LIVE) == "0" or os.environ.get("IPP_NONINTERACTIVE"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _series(rows: Rows, key: str) -> tuple[np.ndarray, np.ndarray]:
    xs = np.array([r.get("step", i) for i, r in enumerate(rows) if key in r], dtype=float)
    ys = np.array([r[key] for r in rows if key in r], dtype=float)
    return xs, ys


def _throughput(rows_by_rank: Sequence[Rows]) -> tuple[np.ndarray, np.ndarray]:
    """Samples/s of all ranks together at each step both ranks finished (sum over ranks)."""
    n = min((len(r) for r in rows_by_rank), default=0)
    if n == 0:
        return np.array([]), np.array([])
    steps = np.array([rows_by_rank[0][i].get("step", i) for i in range(n)], dtype=float)
    total = np.sum([[r[i].get("samples_per_s", 0.0) for i in range(n)] for r in rows_by_rank],
                   axis=0)
    return steps, total


@styled
def live_training(rows_by_rank: Sequence[Rows], title: str = "training on every rank") -> Any:
    """The live view as a static figure: loss per rank, step time per rank (ms), and samples/s
    of all ranks together, against the step."""
    fig = _new_figure(len(rows_by_rank), title)
    _draw(fig, rows_by_rank, title)
    return fig


def _new_figure(p: int, title: str) -> Any:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for r in range(p):
        axes[0].plot([], [], color=rank_color(r), label=f"rank {r}")
        axes[1].plot([], [], color=rank_color(r), label=f"rank {r}")
    axes[2].plot([], [], color=ROLE["global"], linewidth=2, label=f"all {p} ranks (sum)")
    for ax, ylabel, name in zip(axes, ("loss (cross-entropy)", "step time (ms)",
                                       "samples per second"),
                                ("loss", "step time", "throughput"), strict=True):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _draw(fig: Any, rows_by_rank: Sequence[Rows], title: str) -> None:
    ax_loss, ax_time, ax_rate = fig.axes[:3]
    for r, rows in enumerate(rows_by_rank):
        x, y = _series(rows, "loss")
        ax_loss.lines[r].set_data(x, y)
        x, y = _series(rows, "step_time")
        ax_time.lines[r].set_data(x, y * 1e3)
    x, y = _throughput(rows_by_rank)
    ax_rate.lines[0].set_data(x, y)
    for ax in (ax_loss, ax_time, ax_rate):
        ax.relim()
        ax.autoscale_view()
    done = min((len(r) for r in rows_by_rank), default=0)
    fig.suptitle(f"{title} (step {done})" if done else title)


class LiveFigure:
    """One figure that follows training on ``world_size`` ranks.

    ``update(rows_by_rank)`` replaces the rows and redraws at most ``max_hz`` times a second
    (in place, in JupyterLab); ``log(rank, **metrics)`` appends one row; ``close()`` draws the
    final state (the only drawing when live updates are not possible) and returns the figure.
    """

    def __init__(self, world_size: int, title: str = "training on every rank",
                 max_hz: float = 3.0, live: bool | None = None) -> None:
        from .style import CYCLE, RC

        self.rows: list[list[dict[str, float]]] = [[] for _ in range(world_size)]
        self.title = title
        self.min_interval = 1.0 / max_hz if max_hz > 0 else 0.0
        self.live = live_possible() if live is None else live
        self.redraws = 0
        self._last = 0.0
        self._handle: Any = None
        plt = pyplot()
        from cycler import cycler

        with plt.rc_context({**RC, "axes.prop_cycle": cycler(color=CYCLE)}):
            self.fig = _new_figure(world_size, title)

    def update(self, rows_by_rank: Sequence[Rows], force: bool = False) -> bool:
        """Take the newest rows of every rank; redraw if ``max_hz`` allows (or ``force``)."""
        for r, rows in enumerate(rows_by_rank[:len(self.rows)]):
            if rows is not None:
                self.rows[r] = [dict(x) for x in rows]
        return self._maybe_redraw(force)

    def log(self, rank: int, **metrics: float) -> bool:
        """Append one row for ``rank`` (e.g. ``step=, loss=, step_time=, samples_per_s=``)."""
        self.rows[rank].append({k: float(v) for k, v in metrics.items()})
        return self._maybe_redraw(False)

    def _maybe_redraw(self, force: bool) -> bool:
        now = time.monotonic()
        if not self.live or (not force and now - self._last < self.min_interval):
            return False
        self._last = now
        _draw(self.fig, self.rows, self.title)
        from IPython.display import display

        if self._handle is None:
            self._handle = display(self.fig, display_id=True)
        else:
            self._handle.update(self.fig)
        self.redraws += 1
        return True

    def close(self) -> Any:
        """Draw the final state once more, show it, release it from pyplot; returns the figure."""
        _draw(self.fig, self.rows, self.title)
        plt = pyplot()
        try:
            from IPython.display import display

            if self._handle is not None:
                self._handle.update(self.fig)
            elif _in_ipython():
                display(self.fig)
        finally:
            plt.close(self.fig)
        return self.fig


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    return get_ipython() is not None


def published_rows(ar: Any, key: str = "course_live") -> list[list[dict[str, float]] | None]:
    """The newest rows each engine of a running task published (``None`` where none yet)."""
    data = getattr(ar, "data", None) or []
    if isinstance(data, Mapping):  # a single-engine AsyncResult
        data = [data]
    return [d.get(key) if isinstance(d, Mapping) else None for d in data]


def watch(ar: Any, world_size: int | None = None, title: str = "training on every rank",
          max_hz: float = 3.0, timeout: float = 600.0, live: bool | None = None
          ) -> list[list[dict[str, float]]]:
    """Follow a running task (an ``AsyncResult`` over every rank, e.g. from
    ``cluster.view.apply_async(...)`` or ``%%px --noblock``) whose ranks log with
    :class:`~course_utils.torch_dist.live_log.LiveLog`; redraw one figure while it runs, and
    return every rank's rows once it is done (its result rows if it returned them).

    Raises ``TimeoutError`` after ``timeout`` seconds (the task keeps running on the engines).
    """
    p = world_size or len(getattr(ar, "msg_ids", [])) or 1
    view = LiveFigure(p, title=title, max_hz=max_hz, live=live)
    deadline = time.monotonic() + timeout
    try:
        while not ar.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"training still running after {timeout:g} s; "
                                   "Fix: wait for it with ar.get(), or cu.restart() if stuck")
            if view.live:
                view.update(published_rows(ar))
            time.sleep(min(0.05, view.min_interval or 0.05))
        result = ar.get()
        if not isinstance(result, list) or len(result) != p:
            result = [result]
        final = []
        for r, res in enumerate(result):
            if _looks_like_rows(res):
                final.append(res)
            else:
                pub = published_rows(ar)
                final.append((pub[r] if r < len(pub) else None) or [])
        view.update(final, force=False)
    finally:
        view.close()
    return view.rows


def _looks_like_rows(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(r, Mapping) for r in x)
