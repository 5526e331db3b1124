"""tools/install_venv.py: uv is told what pip is configured with (the Makefile's install)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("install_venv", ROOT / "tools" / "install_venv.py")
install_venv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(install_venv)


def test_uv_gets_pips_indexes_links_and_constraints_with_the_environment_first(
        tmp_path, monkeypatch):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///a/simple file:///b/simple\n"
                    "find-links = /from/file\nconstraint = /c.txt\ncert = /ca.pem\n"
                    "timeout = 5\n")
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", "/from/env")
    settings = install_venv.pip_settings(sys.executable)
    assert settings == {"extra-index-url": ["file:///a/simple", "file:///b/simple"],
                        "find-links": ["/from/env"], "constraint": ["/c.txt"],
                        "cert": ["/ca.pem"]}
    cmd = install_venv.uv_command(Path("/v"), ["-e", ".[test]"], settings)
    assert cmd[:3] == ["/v/bin/uv", "pip", "install"]
    assert cmd[-2:] == ["-e", ".[test]"]
    pairs = list(zip(cmd, cmd[1:], strict=False))
    for pair in [("--python", "/v/bin/python"), ("--index-strategy", "unsafe-best-match"),
                 ("--extra-index-url", "file:///a/simple"),
                 ("--extra-index-url", "file:///b/simple"), ("--find-links", "/from/env"),
                 ("--constraint", "/c.txt")]:
        assert pair in pairs
    assert "--compile-bytecode" not in cmd  # Python caches what is imported (the Makefile)
    assert "/from/file" not in cmd and "/ca.pem" not in cmd


def test_without_a_spec_it_says_how_to_call_it():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "install_venv.py")],
                          capture_output=True, text=True, env=dict(os.environ), check=False)
    assert done.returncode == 2 and "install_venv.py VENV SPEC" in done.stderr


def test_make_runs_the_course_with_bytecode_caching_on():
    """CI sets PYTHONDONTWRITEBYTECODE; the Makefile's commands must run without it."""
    show = "show: ; @echo \"[$$PYTHONDONTWRITEBYTECODE]\""
    done = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "--eval", show, "show"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=False)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
