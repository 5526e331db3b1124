"""A learner's memory on the hub host: their lab, kernels and everything those start share one
memory cgroup with a limit (``[hub] max_memory``), so one learner who allocates without end is
stopped by the kernel's OOM killer inside their own group, never a neighbour.

:class:`.lab_spawner.LimitedSpawner` is JupyterHub's local-process spawner (the one ``course
workshop`` configures) with one step added: before the lab's process drops root for the
learner's uid, it moves itself into ``course-labs/<learner>`` (made, with its limit, by the
hub just before). So the lab is inside before it runs a line of the learner's code, and
everything it starts is too; the learner can neither raise the limit nor leave the group (its
files are root's). Works on cgroup v2 (``memory.max``) and on v1's memory hierarchy
(``memory.limit_in_bytes``). Pages a learner's files hold in a tmpfs (``/dev/shm``, a tmpfs
``/tmp``) are charged to their group too.
"""

from __future__ import annotations

from pathlib import Path

#: Where cgroups are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The parent group of every learner's lab group.
PARENT = "course-labs"


def memory_controller(root: Path | None = None) -> tuple[Path, str] | None:
    """Where learners' groups go and the file of their limit: cgroup v2 when its memory
    controller is on, else v1's memory hierarchy (under ``root``, default
    :data:`CGROUP_ROOT`); None when neither is mounted."""
    root = CGROUP_ROOT if root is None else root
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "memory" in controllers.read_text().split():
        return root / PARENT, "memory.max"
    if (root / "memory" / "memory.limit_in_bytes").is_file():
        return root / "memory" / PARENT, "memory.limit_in_bytes"
    return None


def prepare_group(user: str, limit: int, root: Path | None = None) -> Path:
    """Make ``course-labs/<user>`` with its memory ``limit`` (bytes), as root; its
    ``cgroup.procs``. Raises OSError when cgroups cannot be made here."""
    found = memory_controller(root)
    if found is None:
        raise OSError(f"no cgroup memory controller under {root or CGROUP_ROOT}")
    parent, limit_file = found
    v2 = limit_file == "memory.max"  # a v2 child has the controller only if its parent gives it
    if v2:
        _enable_memory(parent.parent)
    parent.mkdir(exist_ok=True)
    if v2:
        _enable_memory(parent)
    group = parent / user
    group.mkdir(exist_ok=True)
    (group / limit_file).write_text(str(limit))
    return group / "cgroup.procs"


def _enable_memory(group: Path) -> None:
    control = group / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def group_of(pid: int) -> str:
    """The memory cgroup path ``pid`` is in (``/proc/PID/cgroup``'s v1 memory line, else the v2
    line); "" when unreadable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    fields = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    v1 = [f[2] for f in fields if "memory" in f[1].split(",")]
    return (v1 or [f[2] for f in fields if f[0] == "0"] or [""])[0]
