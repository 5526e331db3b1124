"""The course's named Jupyter kernel, "Distributed training course" (``dist-training-course``).

A learner with several Pythons could otherwise open a unit in one without torch or the course
package. ``course lab`` installs the kernelspec (idempotent) into the course environment's own
``share/jupyter`` (``sys.prefix``, what ``jupyter kernelspec install --sys-prefix`` does), so
only a Jupyter started from this environment sees it, and its ``argv`` is this environment's
interpreter. The learner's copies of the units ask for it (:func:`set_kernelspec`);
``course doctor`` checks it (:func:`kernel_health`).

The kernel also loads :mod:`course_utils.cluster.kernel.pxoutput` as an IPython extension (``%%px``
output labelled by rank, progress bars drawn in place).

``$COURSE_KERNEL_PREFIX`` installs elsewhere (tests point it at a temporary folder and add
``<prefix>/share/jupyter`` to ``$JUPYTER_PATH``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..settings import ENV_KERNEL_PREFIX, env

if TYPE_CHECKING:
    from nbformat import NotebookNode

KERNEL_NAME = "dist-training-course"
DISPLAY_NAME = "Distributed training course"
#: IPython extensions the course kernel loads at start.
EXTENSIONS = ("course_utils.cluster.kernel.pxoutput",)
INSTALL_FIX = "run `course kernel` (or `course lab`) from the course's environment"


def kernel_prefix() -> Path:
    """Where the kernelspec goes: ``$COURSE_KERNEL_PREFIX``, else this environment's prefix."""
    return Path(env(ENV_KERNEL_PREFIX) or sys.prefix)


def kernel_dir(prefix: str | os.PathLike[str] | None = None) -> Path:
    """The kernelspec folder: ``<prefix>/share/jupyter/kernels/dist-training-course``."""
    return Path(prefix or kernel_prefix()) / "share" / "jupyter" / "kernels" / KERNEL_NAME


def kernel_dict() -> dict[str, Any]:
    """The ``kernel.json`` the course installs: ipykernel's own, this interpreter, our name."""
    from ipykernel.kernelspec import get_kernel_dict

    extra = [f"--IPKernelApp.extra_extensions={name}" for name in EXTENSIONS]
    spec = get_kernel_dict(extra_arguments=extra, python_arguments=["-Xfrozen_modules=off"])
    spec["display_name"] = DISPLAY_NAME
    spec.setdefault("metadata", {})["course"] = "dist-training"
    return spec


def installed_spec(prefix: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The installed ``kernel.json`` under ``prefix``, or None."""
    path = kernel_dir(prefix) / "kernel.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def install(prefix: str | os.PathLike[str] | None = None) -> tuple[Path, bool]:
    """Install the kernelspec unless the same one is there; return (folder, whether written)."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    prefix = Path(prefix or kernel_prefix())
    want = kernel_dict()
    if installed_spec(prefix) == want:
        return kernel_dir(prefix), False
    staging = Path(tempfile.mkdtemp(prefix="course-kernel-"))
    try:
        src = write_kernel_spec(staging / KERNEL_NAME, overrides=want)
        dest = KernelSpecManager().install_kernel_spec(src, kernel_name=KERNEL_NAME,
                                                       prefix=str(prefix))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Path(dest), True


def kernelspec_metadata() -> dict[str, str]:
    """What a notebook's ``metadata.kernelspec`` says to ask for the course kernel."""
    return {"name": KERNEL_NAME, "display_name": DISPLAY_NAME, "language": "python"}


def set_kernelspec(nb: NotebookNode) -> NotebookNode:
    """Make ``nb`` ask for the course kernel (in place; returns ``nb``)."""
    nb.metadata["kernelspec"] = kernelspec_metadata()
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def find_spec(kernel_dirs: list[str] | None = None) -> tuple[str, dict[str, Any]] | None:
    """The course kernelspec as Jupyter finds it on its search path (or in ``kernel_dirs``):
    (folder, kernel.json), or None."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager() if kernel_dirs is None else KernelSpecManager(kernel_dirs=kernel_dirs)
    try:
        spec = ksm.get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        return None
    return spec.resource_dir, spec.to_dict()


class KernelHealth(NamedTuple):
    """Whether the course kernel works, what was found, and the fix when it does not."""

    ok: bool
    detail: str
    fix: str = ""


def kernel_health(timeout: float = 60) -> KernelHealth:
    """The kernel is installed, visible to Jupyter, and imports the course (``course doctor``
    shows it as its ``kernel`` line)."""
    found = find_spec()
    if found is None:
        return KernelHealth(False, f"no Jupyter kernel named {KERNEL_NAME!r}", INSTALL_FIX)
    where, spec = found
    python = spec["argv"][0]
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return KernelHealth(False, f"{where} runs {python}, which does not exist", INSTALL_FIX)
    try:
        proc = subprocess.run([python, "-c", "import course_utils, ipykernel, ipyparallel"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return KernelHealth(False, f"{python} took over {timeout:g} s to import the course",
                            INSTALL_FIX)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return KernelHealth(False, f"{python} cannot import the course ({last})",
                            f"{INSTALL_FIX}; or `pip install -e .` into {python}'s environment")
    detail = f"{spec['display_name']!r} ({KERNEL_NAME}) runs {python}"
    if Path(python).parent.parent != Path(sys.prefix):
        detail += f" (another environment than this command's, {sys.prefix})"
    return KernelHealth(True, detail)
