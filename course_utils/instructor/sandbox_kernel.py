"""The kernel :mod:`.sandbox` starts: ``python -m course_utils.instructor.sandbox_kernel ARGS``
is ``python -m ipykernel_launcher ARGS`` with an audit hook (PEP 578) installed first.

The hook writes one line to the kernel's standard error, which the grader reads through a
pipe, for each attempt by the kernel's Python to open, list or change a path under the hidden
folders (``$COURSE_SANDBOX_HIDDEN``, minus the paths bound back in, ``$COURSE_SANDBOX_SEEN``,
and the folder the notebook is graded in) or to connect
to an address other than loopback. The sandbox already makes each attempt fail; the hook is
how the grader learns that one was made. It records what Python does (``open``,
``os.listdir``, ``socket.connect``...), not raw system calls, and a hook cannot be removed.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any

from ..settings import ENV_SANDBOX_HIDDEN, ENV_SANDBOX_SEEN

#: The prefix of the hook's lines on standard error.
MARK = "COURSE-SANDBOX-DENIED "
PATH_EVENTS = {"open": "open", "os.listdir": "list", "os.scandir": "list", "os.remove": "remove",
               "os.rename": "rename", "os.mkdir": "mkdir", "os.rmdir": "rmdir",
               "shutil.rmtree": "remove", "os.chmod": "chmod", "os.truncate": "truncate"}


def _inside(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def make_hook(hidden: list[str], allowed: list[str], out: int) -> Any:
    """The audit hook: report ``hidden`` paths (not those under ``allowed``) on fd ``out``."""
    busy = [False]

    def say(what: str, target: str) -> None:
        os.write(out, (MARK + json.dumps({"what": what, "target": target}) + "\n").encode())

    def hook(event: str, args: tuple) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            if event in PATH_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
                path = os.path.abspath(os.fsdecode(args[0]))
                if _inside(path, hidden) and not _inside(path, allowed):
                    say(PATH_EVENTS[event], path)
            elif event == "socket.connect" and len(args) > 1 and isinstance(args[1], tuple):
                host = str(args[1][0])
                if host not in ("127.0.0.1", "::1", "localhost") and not host.startswith("127."):
                    say("connect", f"{host}:{args[1][1]}")
        except Exception:  # the hook never breaks the learner's code
            pass
        finally:
            busy[0] = False

    return hook


def main() -> None:
    hidden, seen = ([p for p in os.environ.pop(key, "").split(os.pathsep) if p]
                    for key in (ENV_SANDBOX_HIDDEN, ENV_SANDBOX_SEEN))
    out = os.dup(2)  # its own copy of the pipe: a cell that closes fd 2 does not silence it
    sys.addaudithook(make_hook(hidden, [*seen, os.getcwd()], out))
    sys.argv[0] = "ipykernel_launcher"
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
