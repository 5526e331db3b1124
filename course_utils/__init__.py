"""course_utils: the helper package behind the distributed-training course notebooks.

Importing it is cheap: neither torch nor TensorFlow is imported in the notebook kernel; they
load only on the engines that use them.

The folders follow the architecture::

    cluster/      framework-free: lifecycle, calls on ranks, launching, sharing, profiles, ports
    torch_dist/   PyTorch: process group, ring and bandwidth helpers, training helpers, recorders
    tf_dist/      TensorFlow: cluster spec, servers on engines, coordinator, v1 graph helpers
    viz/          figures: pure functions of recorded arrays
    checks/       engine-side probes that graded tests call
    assignments/  the lessons as nbgrader assignments: the student release, nbgrader set-up
    learner/      the learner's app: ``course lab``, the home page, working folder, kernel
    instructor/   release, grade, feedback, slides, doctor, bench (the ``course`` commands)
    data.py       datasets shared by both tracks; errors.py, settings.py, compat.py, cli.py

Notebooks use the short names re-exported here: ``cu.start()``, ``cu.start_torch()``,
``from course_utils import p2p, bandwidth, train, viz, data, checks, ports, join_watch, tf_dist``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .compat import install_import_guard

install_import_guard()  # before anything can import TensorFlow; also runs on every engine

from . import tf_dist  # noqa: E402  # cheap: TensorFlow loads only inside the helpers that need it
from .cluster import CourseCluster, current, restart, start, stop  # noqa: E402
from .errors import CourseError  # noqa: E402
from .torch_dist import start as start_torch  # noqa: E402
from .torch_dist import stop as stop_torch  # noqa: E402

__version__ = "0.1.0"

#: Short names for sub-modules, imported on first use (``from course_utils import train``).
_LAZY = {
    "p2p": ".torch_dist.p2p",
    "bandwidth": ".torch_dist.bandwidth",
    "train": ".torch_dist.train",
    "viz": ".viz",
    "checks": ".checks",
    "data": ".data",
    "ports": ".cluster.ports",
    "join_watch": ".torch_dist.join_watch",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name], __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'course_utils' has no attribute {name!r}")


__all__ = [
    "CourseCluster",
    "CourseError",
    "current",
    "restart",
    "start",
    "start_torch",
    "stop",
    "stop_torch",
    "tf_dist",
    *_LAZY,
]
