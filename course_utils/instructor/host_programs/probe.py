"""On a host: the interpreter, package versions, GPUs, interfaces, shared folders and whether
the controller's ports are reachable; one ``@@PROBE{json}`` line. Argument: a JSON object with
``packages``, ``shared`` (path -> token), ``marker``, ``connect`` (``host:port`` list), ``timeout``.
"""

import importlib.metadata as md
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys


def course_version() -> str | None:
    """course_utils' version and the folder it is imported from, read without importing it."""
    spec = importlib.util.find_spec("course_utils")
    if not (spec and spec.origin):
        return None
    with open(spec.origin) as f:
        m = re.search(r'__version__ = "([^"]+)"', f.read())
    return (m.group(1) if m else "?") + " at " + os.path.dirname(os.path.dirname(spec.origin))


def interfaces() -> dict[str, list[str]]:
    run = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                         timeout=5)
    links = json.loads(run.stdout or "[]")
    return {link["ifname"]: [a["local"] for a in link.get("addr_info", [])] for link in links}


def shared(paths: dict[str, str], marker: str) -> dict[str, bool | str]:
    """For each folder: True when it holds the marker file the controller wrote (same folder)."""
    out: dict[str, bool | str] = {}
    for path, token in paths.items():
        try:
            with open(os.path.join(path, marker)) as f:
                out[path] = f.read() == token
        except OSError:
            out[path] = "missing" if not os.path.isdir(path) else False
    return out


def ports(addrs: list[str], timeout: float) -> dict[str, str]:
    out = {}
    for addr in addrs:
        host, port = addr.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            out[addr] = "ok"
        except OSError as e:
            out[addr] = type(e).__name__ + ": " + str(e)
    return out


def main() -> None:
    args = json.loads(sys.argv[1])
    out = {"python": sys.version.split()[0], "executable": sys.executable, "versions": {},
           "gpus": 0, "interfaces": {}}
    if (mine := course_version()) is not None:
        out["versions"]["course_utils"] = mine
    for label, dist in args["packages"].items():
        try:
            out["versions"][label] = md.version(dist)
        except md.PackageNotFoundError:
            out["versions"][label] = None
    try:
        out["gpus"] = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    try:
        out["interfaces"] = interfaces()
    except Exception as e:  # reported, not fatal: the other checks still run
        out["interfaces_error"] = repr(e)
    out["shared"] = shared(args["shared"], args["marker"])
    out["ports"] = ports(args["connect"], args["timeout"])
    print("@@PROBE" + json.dumps(out))


if __name__ == "__main__":
    main()
