"""Guards for known crashes between the frameworks this course loads side by side.

TensorFlow 2.21 and triton (which torchvision pulls in through torch) both carry LLVM; when
TensorFlow is imported first, loading triton's extension kills the process with a segmentation
fault (seen here: ``import torch; import tensorflow; import torchvision`` -> SIGSEGV). torch and
torchvision treat triton as optional, so refusing the import after TensorFlow turns a crash into
"no triton", which CPU and eager CUDA code never need.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any


class _NoTritonAfterTensorFlow(importlib.abc.MetaPathFinder):
    """Refuse ``import triton`` in a process that already imported TensorFlow."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if (name == "triton" or name.startswith("triton.")) and "tensorflow" in sys.modules:
            raise ImportError(
                "triton is not loaded in a process that already imported TensorFlow (loading "
                "it would crash the process); restart the kernel or engines (cu.restart()) to "
                "use torch.compile"
            )
        return None


def install_import_guard() -> bool:
    """Install the guard once per process; returns True when this call installed it."""
    if any(isinstance(f, _NoTritonAfterTensorFlow) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _NoTritonAfterTensorFlow())
    return True
