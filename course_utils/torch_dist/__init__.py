"""The PyTorch track: process group on every engine, ring and bandwidth helpers, training helpers.

Modules: :mod:`.process_group` (backend choice, start/stop with timeouts; unit 0) and
:mod:`.messages` (what torch's error messages mean, in the course's words),
:mod:`.p2p` (ring chunking, byte accounting, the send/recv watchdog; unit 1),
:mod:`.bandwidth` (algbw/busbw, timing; units 1 and 7), :mod:`.join_watch` (a hand-written
``init_process_group`` watched and explained; unit 0), :mod:`.record` and :mod:`.live_log`
(recordings for the figures; :mod:`.px_functions` copies a learner's ``%%px`` function),
:mod:`.perf` (unit 7), :mod:`.faults` (the faults of unit 8),
:mod:`.train` (models, reference SGD, metrics; units 2-3). The kernel side never imports torch;
the ``engine_*``/``_engine_*`` functions import it on the engines.
"""

from __future__ import annotations

from .process_group import BACKENDS, choose_backend, pg_backend, start, stop

__all__ = ["BACKENDS", "choose_backend", "pg_backend", "start", "stop"]
