"""The one way the course watches a learner's calls to ``torch.distributed``: the module's
functions replaced by wrappers for the length of a ``with`` block, and put back after it, also
when the block raises.

A learner's cell calls ``dist.all_reduce(...)``, ``dist.isend(...)``: a name looked up in
``torch.distributed`` at the moment of the call, so a wrapper set there sees every call the
cell makes (torch's own code mostly calls its functions directly, and is not seen). The
probes count calls and bytes with it (``checks``), forbid a collective in an exercise built
from ``isend``/``irecv`` (unit 1), record a ring's messages and FSDP's gathers (``record``,
``fsdp_lifecycle``) and bound each wait of a point-to-point exercise (``p2p.watch``).
Introduced for ``01_collectives``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

Wrap = Callable[[str, Callable[..., Any]], Callable[..., Any]]


@contextlib.contextmanager
def replaced(wrap: Wrap, names: Iterable[str], *, c10d: bool = False
             ) -> Iterator[dict[str, Callable[..., Any]]]:
    """Inside the block, each of ``torch.distributed``'s functions in ``names`` (those it has)
    is ``wrap(name, real)``; yields the real ones by name. ``c10d``: replaced in
    ``torch.distributed.distributed_c10d`` too, by the same wrapper, where
    ``batch_isend_irecv``'s ``P2POp`` checks that its op is ``isend`` or ``irecv``."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    real = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
    spies = {name: wrap(name, fn) for name, fn in real.items()}
    places = (dist, distributed_c10d) if c10d else (dist,)
    before = [(where, name, getattr(where, name)) for where in places for name in spies
              if hasattr(where, name)]
    try:
        for where, name, _ in before:
            setattr(where, name, spies[name])
        yield real
    finally:
        for where, name, fn in reversed(before):
            setattr(where, name, fn)
