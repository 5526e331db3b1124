"""The alpha-beta cost model of all_reduce (performance unit): fit, predictions, one figure.

A message of ``n`` bytes costs ``alpha + n * beta``: ``alpha`` is the latency of one message,
``1/beta`` the bandwidth of one link. The three ways to all-reduce ``n`` bytes over ``p`` ranks:

* **ring** (reduce-scatter then all-gather, ``2(p-1)`` steps of ``n/p`` bytes):
  ``2(p-1) alpha + 2(p-1)/p * n beta``, the ``2(p-1)/p`` of busbw;
* **tree** (binomial reduce to a root, then broadcast back): ``2 ceil(log2 p) (alpha + n beta)``;
* **parameter server** (one ps; every rank pushes ``n`` and pulls ``n``, all through the ps's
  link): ``2 (alpha + p n beta)``.

:func:`fit_alpha_beta` recovers ``alpha`` and ``beta`` from measured times (recorded on the
engines by :func:`course_utils.torch_dist.record.engine_sweep_all_reduce`), reading them as a
ring; :func:`cost_model` draws the measurement, the fit and the three predictions, log-log.
Pure functions: nothing here talks to a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .style import ROLE, human_bytes, pyplot, styled

MODELS = ("ring", "tree", "ps")


def predict(model: str, nbytes: Any, p: int, alpha: float, beta: float) -> np.ndarray:
    """Seconds to all-reduce ``nbytes`` (scalar or array) over ``p`` ranks with ``model``."""
    n = np.asarray(nbytes, dtype=float)
    if p < 2:
        return np.zeros_like(n)
    if model == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    if model == "tree":
        return 2 * math.ceil(math.log2(p)) * (alpha + n * beta)
    if model == "ps":
        return 2 * (alpha + p * n * beta)
    raise ValueError(f"unknown model {model!r}; one of {MODELS}")


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], p: int
                   ) -> dict[str, float]:
    """Fit ``t = a + b n`` to measured all_reduce times, then read it as a ring on ``p`` ranks:
    ``alpha = a / (2(p-1))``, ``beta = b p / (2(p-1))``.

    The fit minimises *relative* errors (each point weighted by ``1/t``), so the small messages,
    which fix ``alpha``, count as much as the large ones, which fix ``beta``. Returns ``alpha``
    (s), ``beta`` (s/byte), ``bandwidth`` (bytes/s, ``1/beta``), ``a``, ``b`` and the median
    relative error of the fit.
    """
    n = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n.shape != t.shape or n.size < 2:
        raise ValueError(f"need matching sizes and times, at least 2 (got {n.size}, {t.size})")
    if p < 2:
        raise ValueError("a cost model needs p >= 2 ranks")
    if np.any(t <= 0):
        raise ValueError("times must be positive seconds")
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    a, b = max(float(a), 0.0), max(float(b), 1e-30)
    steps = 2 * (p - 1)
    alpha, beta = a / steps, b * p / steps
    rel = np.abs((a + b * n) - t) / t
    return {"alpha": alpha, "beta": beta, "bandwidth": 1.0 / beta, "a": a, "b": b,
            "median_rel_error": float(np.median(rel)), "p": float(p)}


def describe_fit(fit: dict[str, float]) -> str:
    """One printable line: alpha in microseconds, bandwidth in GB/s."""
    return (f"alpha = {fit['alpha'] * 1e6:.1f} us per message, "
            f"beta = {fit['beta'] * 1e9:.3f} ns/byte (link bandwidth 1/beta = "
            f"{fit['bandwidth'] / 1e9:.2f} GB/s); median fit error "
            f"{fit['median_rel_error'] * 100:.0f}%")


@styled
def cost_model(nbytes: Sequence[float], seconds: Sequence[float], p: int,
               fit: dict[str, float] | None = None, title: str | None = None,
               max_p: int = 64) -> Any:
    """Left: measured all_reduce time vs message size (log-log), the alpha-beta fit and the
    predicted ring, tree and parameter-server curves for ``p`` ranks. Right: the predicted time
    of the largest message as the number of ranks grows to ``max_p``.
    """
    plt = pyplot()
    fit = fit or fit_alpha_beta(nbytes, seconds, p)
    n = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    alpha, beta = fit["alpha"], fit["beta"]
    grid = np.logspace(np.log10(n.min()), np.log10(n.max()), 100)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    ax.loglog(n, t * 1e3, "o", color=ROLE["measured"], markersize=7,
              label=f"measured: dist.all_reduce on {p} ranks")
    styles = {"ring": ("-", "ring: 2(p-1)α + 2(p-1)/p·nβ  (the fit)"),
              "tree": ("--", "tree: 2⌈log₂p⌉(α + nβ)"),
              "ps": (":", "parameter server: 2(α + p·nβ)")}
    for model in MODELS:
        ls, label = styles[model]
        ax.loglog(grid, predict(model, grid, p, alpha, beta) * 1e3, ls, color=ROLE[model],
                  linewidth=2.2, label=label)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (ms)")
    ax.set_title(title or f"all_reduce cost on {p} ranks: measured and alpha-beta models")
    ax.grid(True, which="major", alpha=0.3)
    ticks = [v for v in 4.0 ** np.arange(0, 16) if n.min() <= v <= n.max()]
    if ticks:
        ax.set_xticks(ticks, [human_bytes(v) for v in ticks], rotation=30)
        ax.minorticks_off()
    ax.legend(loc="upper left")
    ax.text(0.02, 0.70, f"fit: α = {alpha * 1e6:.0f} µs, 1/β = {fit['bandwidth'] / 1e9:.2f} GB/s"
            f"\nbusbw factor 2(p-1)/p = {2 * (p - 1) / p:.2f}", transform=ax.transAxes,
            ha="left", va="top", fontsize=11,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"})

    big = float(n.max())
    ps_range = 2 ** np.arange(1, int(np.log2(max_p)) + 1)
    for model in MODELS:
        ls, _ = styles[model]
        ax2.plot(ps_range, [predict(model, big, int(q), alpha, beta) * 1e3 for q in ps_range],
                 ls, marker="o", markersize=4, color=ROLE[model], linewidth=2.2,
                 label={"ring": "ring", "tree": "tree", "ps": "parameter server"}[model])
    ax2.axvline(p, color="0.6", linewidth=1)
    ax2.text(p, 0.98, f" p = {p} (measured)", transform=ax2.get_xaxis_transform(),
             va="top", fontsize=10, color="0.4")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(ps_range, [str(q) for q in ps_range])
    ax2.minorticks_off()
    ax2.set_xlabel("ranks p")
    ax2.set_ylabel("predicted time (ms)")
    ax2.set_title(f"predicted for {human_bytes(big)} as p grows")
    ax2.grid(True, alpha=0.3)
    ax2.legend(loc="lower right")
    fig.tight_layout()
    return fig


@styled
def sweep_compare(nbytes: Sequence[float], series: dict[str, Sequence[float]], p: int,
                  fit: dict[str, float] | None = None, title: str | None = None) -> Any:
    """Several all-reduce implementations on the same axes (``07_performance``: gloo's
    ``dist.all_reduce`` and the learner's ring of ``01_collectives``). Left: time vs message
    size (log-log), with the ring prediction of ``fit`` if given. Right: busbw vs size, the
    bandwidth each link carried (``n/t · 2(p-1)/p``). ``series`` maps a name to seconds."""
    plt = pyplot()
    n = np.asarray(nbytes, dtype=float)
    if not series:
        raise ValueError("series is empty: pass {name: seconds per size}")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    factor = 2 * (p - 1) / p
    colours = [ROLE["measured"], ROLE["comm"], ROLE["ring"], ROLE["tree"]]
    for k, (name, secs) in enumerate(series.items()):
        t = np.asarray(secs, dtype=float)
        if t.shape != n.shape:
            raise ValueError(f"{name}: {t.size} times for {n.size} sizes")
        colour, marker = colours[k % len(colours)], "os^v"[k % 4]
        ax.loglog(n, t * 1e3, marker + "-", color=colour, linewidth=1.8, markersize=6,
                  label=name)
        ax2.semilogx(n, n / t * factor / 1e6, marker + "-", color=colour, linewidth=1.8,
                     markersize=6, label=name)
    if fit is not None:
        grid = np.logspace(np.log10(n.min()), np.log10(n.max()), 100)
        ax.loglog(grid, predict("ring", grid, p, fit["alpha"], fit["beta"]) * 1e3, "--",
                  color="0.5", linewidth=1.5, label="alpha-beta fit (ring)")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (ms)")
    ax.set_title(title or f"all-reduce time on {p} ranks")
    ax2.set_xlabel("message size (bytes)")
    ax2.set_ylabel("busbw (MB/s)")
    ax2.set_title(f"busbw = n/t · 2(p-1)/p = n/t · {factor:.2f}")
    ticks = [v for v in 4.0 ** np.arange(0, 16) if n.min() <= v <= n.max()]
    for a in (ax, ax2):
        a.grid(True, which="major", alpha=0.3)
        if ticks:
            a.set_xticks(ticks, [human_bytes(v) for v in ticks], rotation=30)
            a.minorticks_off()
        a.legend(loc="upper left")
    fig.tight_layout()
    return fig
