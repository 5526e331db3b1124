"""``course grade --sandbox``: each submission's kernel, and the cluster it starts, in a sandbox.

Grading runs a learner's code. Without a sandbox it runs as the instructor: a kernel cell can
read ``gradebook.db``, every other learner's submission and the source notebooks (solutions,
hidden tests), and write beside the gradebook. With ``--sandbox`` the kernel of each graded
notebook starts under bubblewrap (``bwrap``, Debian's ``bubblewrap``):

- as ``nobody`` in its own user namespace (outside: the grader's uid without its
  capabilities, so what protects the grader's files is what the sandbox hides);
- with its own process, IPC and network namespaces: only its own loopback, so the cluster the
  notebook's ``cu.start()`` launches runs *inside* (controller and engines are the kernel's
  children), and nothing outside is reachable; every process in it ends with the kernel;
- seeing the file system read-only, with the course folder (gradebook, submissions, source),
  the source notebooks, the instructor's home, every person's home (``/home``: at a workshop,
  the learners' work) and ``/tmp`` replaced by empty folders; only
  the folder nbgrader grades this notebook in is writable;
- talking to the grader over IPC sockets in a folder of its own (no TCP port at all).

What the sandbox cannot show is reported by what it does: a cell that tries to read another
learner's work fails (the file is not there), and that failure is in the graded notebook.
Introduced in the instructor's guide (docs/instructor.md, "Grading in a sandbox").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import List, Unicode

from ..errors import CourseError
from ..settings import ENV_SANDBOX_HIDDEN, ENV_SANDBOX_SEEN

#: Environment variables a sandboxed kernel keeps (by prefix); everything else is dropped.
KEEP_ENV = ("COURSE_", "OMP_", "MKL_", "TF_CPP_", "LANG", "LC_", "TZ", "PYTHONHASHSEED")
#: The user the kernel runs as, inside its own user namespace.
NOBODY = "65534"


class SandboxUnavailable(CourseError):
    """``--sandbox`` was asked for and bubblewrap cannot run here."""


def bwrap() -> str:
    """The ``bwrap`` executable, or a clear error naming how to get it."""
    found = shutil.which("bwrap")
    if not found:
        raise SandboxUnavailable(
            "course grade --sandbox needs bubblewrap (bwrap), which is not installed",
            "install it (Debian/Ubuntu: apt-get install bubblewrap), or grade without "
            "--sandbox on a machine where every submission is trusted")
    return found


def kept_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The part of ``environ`` a sandboxed kernel sees (no tokens, no instructor paths)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(KEEP_ENV)}


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without those inside another of them (hidden already), in their order."""
    real = [os.path.realpath(p) for p in paths]
    return [p for p, r in zip(paths, real, strict=True)
            if not any(r != o and r.startswith(o.rstrip("/") + "/") for o in real)]


def sandbox_argv(hide: list[str], writable: list[str], readable: list[str],
                 env: dict[str, str], cwd: str) -> list[str]:
    """The ``bwrap`` prefix: hide ``hide`` (empty read-only folders), then bind ``readable``
    read-only and ``writable`` read-write at their own paths, on top; ``env`` is the whole
    environment."""
    hide = _outermost(hide)
    argv = [bwrap(), "--die-with-parent", "--unshare-all", "--uid", NOBODY, "--gid", NOBODY,
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--dir", "/tmp/home"]
    for path in hide:
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
        elif os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in readable:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for path in writable:
        argv += ["--bind", path, path]
    for path in hide:  # read-only too: a write there fails instead of landing in a tmpfs
        if os.path.isdir(path):
            argv += ["--remount-ro", path]
    python_bin = str(Path(sys.executable).parent)
    argv += ["--chdir", cwd, "--clearenv",
             "--setenv", "PATH", f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
             "--setenv", "HOME", "/tmp/home"]
    for key, value in sorted(env.items()):
        argv += ["--setenv", key, value]
    return [*argv, "--"]


#: The module the sandboxed kernel runs instead of ``ipykernel_launcher``.
KERNEL_MODULE = "course_utils.instructor.sandbox_kernel"
#: Attempts the audit hook reported, by the folder the notebook was graded in.
ATTEMPTS: dict[str, list[dict[str, str]]] = {}


def _read_stderr(fd: int, cwd: str) -> None:
    """Pass the kernel's stderr on, keeping the audit hook's lines in :data:`ATTEMPTS`."""
    from .sandbox_kernel import MARK

    with os.fdopen(fd, "r", errors="replace") as stream:
        for line in stream:
            if line.startswith(MARK):
                with contextlib.suppress(ValueError):
                    ATTEMPTS.setdefault(os.path.realpath(cwd), []).append(
                        json.loads(line[len(MARK):]))
            else:
                sys.stderr.write(line)


def attempts_in(folder: str | Path) -> list[dict[str, str]]:
    """What the kernel graded in ``folder`` tried and the sandbox denied (taken: asked once)."""
    return ATTEMPTS.pop(os.path.realpath(folder), [])


def describe(attempts: list[dict[str, str]], limit: int = 4) -> str:
    """``tried what the sandbox denies: open /course/gradebook.db, ...`` (first ``limit``)."""
    seen = list(dict.fromkeys(f"{a.get('what')} {a.get('target')}" for a in attempts))
    more = f" and {len(seen) - limit} more" if len(seen) > limit else ""
    return "tried what the sandbox denies: " + ", ".join(seen[:limit]) + more


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel starts inside :func:`sandbox_argv`'s sandbox and talks
    over IPC sockets in a folder of its own (set ``hide`` and ``readable`` by config)."""

    hide = List(Unicode(), help="paths the kernel must not see").tag(config=True)
    readable = List(Unicode(), help="paths inside hidden ones it may read").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        self.socket_dir = tempfile.mkdtemp(prefix="course-grade-ipc-")
        os.chmod(self.socket_dir, 0o777)  # the kernel's user (nobody) creates its sockets here
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("ip", os.path.join(self.socket_dir, "kernel"))
        super().__init__(**kwargs)
        self.sandbox_cwd = os.getcwd()

    async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
        self.sandbox_cwd = str(kw.get("cwd") or self.sandbox_cwd)
        os.chmod(self.sandbox_cwd, 0o777)  # nobody writes the notebook's files here
        read_end, write_end = os.pipe()  # the kernel's stderr: the audit hook's lines come here
        kw["stderr"] = write_end
        try:
            await super().start_kernel(**kw)
        finally:
            os.close(write_end)
        threading.Thread(target=_read_stderr, args=(read_end, self.sandbox_cwd), daemon=True,
                         name="sandbox-stderr").start()

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        os.chmod(self.connection_file, 0o644)  # read by the kernel's user; it holds no secret
        readable = [sys.base_prefix, sys.prefix, *self.readable, self.connection_file]
        writable = [self.socket_dir, self.sandbox_cwd]
        env = {**kept_env(),
               ENV_SANDBOX_HIDDEN: os.pathsep.join(self.hide),
               ENV_SANDBOX_SEEN: os.pathsep.join([*readable, *writable])}
        for i in range(1, len(cmd)):  # ipykernel, with the audit hook of sandbox_kernel first
            if cmd[i - 1] == "-m" and cmd[i] == "ipykernel_launcher":
                cmd[i] = KERNEL_MODULE
        return sandbox_argv(list(self.hide), writable, readable, env, self.sandbox_cwd) + cmd

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:  # type: ignore[override]
        await super().shutdown_kernel(now=now, restart=restart)
        if not restart:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def people_homes() -> list[str]:
    """``/home`` and every other home of a person's account (uid >= 1000): at a workshop the
    learners' work lives there, and a graded notebook must not read another learner's."""
    import pwd

    homes = ["/home"] if os.path.isdir("/home") else []
    for entry in pwd.getpwall():
        home = os.path.realpath(entry.pw_dir)
        if (1000 <= entry.pw_uid < 65534 and os.path.isdir(home) and home != "/"
                and not home.startswith("/home/") and home not in homes):
            homes.append(home)
    return homes


def configure(cfg: Any, root: Path) -> None:
    """Make nbgrader's execution of every notebook under ``cfg`` run sandboxed; ``root`` is the
    course folder (hidden, but for the folder each notebook is graded in)."""
    bwrap()
    import course_utils

    from ..assignments.lessons import NOTEBOOK_DIR

    package = str(Path(course_utils.__file__).resolve().parent)
    cfg.CourseExecute.kernel_manager_class = SandboxedKernelManager
    cfg.SandboxedKernelManager.hide = [str(root), str(NOTEBOOK_DIR), os.path.expanduser("~"),
                                       *people_homes()]
    cfg.SandboxedKernelManager.readable = [package]
