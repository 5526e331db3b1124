"""course_utils: the helper package behind the distributed-training course notebooks.

Importing it is cheap: neither torch nor TensorFlow is imported in the notebook kernel; they
load only on the engines that use them.
"""

from __future__ import annotations

from .compat import install_import_guard

install_import_guard()  # before anything can import TensorFlow; also runs on every engine

from . import tf_dist  # noqa: E402  # cheap: TensorFlow loads only inside the helpers that need it
from .cluster import CourseCluster, current, restart, start, stop  # noqa: E402
from .errors import CourseError  # noqa: E402
from .torch_dist import destroy as destroy_torch  # noqa: E402
from .torch_dist import init as init_torch  # noqa: E402

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
