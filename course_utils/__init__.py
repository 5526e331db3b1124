"""course_utils: the helper package behind the distributed-training course notebooks.

Importing it is cheap: neither torch nor TensorFlow is imported in the notebook kernel; they
load only on the engines that use them.
"""

from __future__ import annotations

from . import tf_dist  # cheap: TensorFlow loads only inside the helpers that need it
from .cluster import CourseCluster, current, restart, start, stop
from .errors import CourseError
from .torch_dist import destroy as destroy_torch
from .torch_dist import init as init_torch

__version__ = "0.1.0"

__all__ = [
    "CourseCluster",
    "CourseError",
    "current",
    "destroy_torch",
    "init_torch",
    "restart",
    "start",
    "stop",
    "tf_dist",
]
