"""Install the course into a virtual environment: ``python tools/install_venv.py VENV SPEC``.

``make lab`` and ``make test`` call it (``SPEC`` is ``-e .`` or ``-e .[test]``). It installs with
uv when uv can be had: on a 2-core machine uv put this course's 213 packages (PyTorch with its
CUDA libraries, TensorFlow, JupyterLab) into a fresh environment in 27 s of wall time, where pip
took 161 s. uv does not read pip's configuration, so the index, extra indexes, find-links and
constraints that ``pip config list`` shows are handed to it, and it is told to choose among all
indexes as pip does (``--index-strategy unsafe-best-match``): both install the same releases
from the same places. When uv cannot be installed or fails, pip does the work, as before.

Neither byte-compiles at install (uv's ``--compile-bytecode`` took 45 s of CPU, mostly for
modules nothing imports): Python caches what is imported, on first import, since the Makefile
runs without ``PYTHONDONTWRITEBYTECODE`` (see there).

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

#: pip's setting -> uv's option (each value may hold several, separated by spaces).
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings(python: str) -> dict[str, list[str]]:
    """What ``pip config list`` says, for the settings uv needs (environment over files)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    found: dict[str, tuple[bool, list[str]]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if not sep or name not in OPTIONS and name != "cert":
            continue
        from_env = scope.startswith(":env:")
        if name in found and found[name][0] and not from_env:
            continue  # a PIP_* variable wins over a configuration file, as in pip
        found[name] = (from_env, shlex.split(value.strip().strip("'\"")))
    return {name: values for name, (_, values) in found.items()}


def uv_command(venv: Path, spec: list[str], settings: dict[str, list[str]]) -> list[str]:
    """The ``uv pip install`` line that installs ``spec`` as pip would here."""
    cmd = [str(venv / "bin" / "uv"), "pip", "install", "--quiet",
           "--python", str(venv / "bin" / "python"), "--index-strategy", "unsafe-best-match"]
    for name, option in OPTIONS.items():
        for value in settings.get(name, []):
            cmd += [option, value]
    return cmd + spec


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    venv, spec = Path(argv[0]), argv[1:]
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--no-compile"]
    settings = pip_settings(python)
    env = dict(os.environ)
    if settings.get("cert") and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = settings["cert"][0]
    if subprocess.run([*pip, "uv"], check=False).returncode == 0:
        if subprocess.run(uv_command(venv, spec, settings), env=env, check=False).returncode == 0:
            return 0
        print("install_venv: uv failed; installing with pip instead", file=sys.stderr)
    return subprocess.run([*pip, *spec], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
