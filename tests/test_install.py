"""Installed, not editable: a wheel built from this checkout, installed into a fresh virtual
environment, works from another directory (profiles and notebooks ship with it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The module fixture builds a wheel and a venv first.
pytestmark = pytest.mark.timeout(1200)

LIGHT_CHECK = """
import course_utils, sys
from course_utils.cluster.profiles import load_profile
from course_utils.assignments import lessons
from course_utils.cli import _notebooks_dir
print("package", course_utils.__file__)
print("profile", load_profile("two-hosts").host_order)
print("notebooks", len(lessons.source_notebooks()), lessons.NOTEBOOK_DIR)
assert sys.prefix in course_utils.__file__ and sys.prefix in str(lessons.NOTEBOOK_DIR)
assert _notebooks_dir() == lessons.NOTEBOOK_DIR
"""


def _copy_source(dst: Path) -> Path:
    """What `git archive` would give: the files the wheel is built from, without caches."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dst / name)
    shutil.copytree(ROOT / "course_utils", dst / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder, pattern in (("notebooks", "*.ipynb"), ("profiles", "*.toml")):
        (dst / folder).mkdir()
        for f in (ROOT / folder).glob(pattern):
            shutil.copy(f, dst / folder / f.name)
    return dst


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel of this checkout in a fresh venv: (venv, environment for running it)."""
    tmp = tmp_path_factory.mktemp("install")
    src = _copy_source(tmp / "src")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True)
    wheel = next((tmp / "dist").glob("*.whl"))
    # A fresh venv holding only the course; the big dependencies come from this environment's
    # site-packages on PYTHONPATH (its .pth files, e.g. the editable install, are not read).
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True, capture_output=True, env=env)
    env.update(PYTHONPATH=sysconfig.get_paths()["purelib"], IPYTHONDIR=str(tmp / "ipy"),
               COURSE_CLUSTER_ID=f"pytest-install-{os.getpid()}")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return {"venv": venv, "env": env, "cwd": elsewhere, "wheel": wheel}


def test_wheel_ships_notebooks_and_profiles_and_runs_from_elsewhere(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    shipped = [n for n in names if "/share/dist-training-course/" in n]
    assert sum(n.endswith(".ipynb") for n in shipped) == len(list(ROOT.glob("notebooks/*.ipynb")))
    assert any(n.endswith("profiles/two-hosts.toml") for n in shipped)
    venv, env, cwd = installed["venv"], installed["env"], installed["cwd"]
    light = subprocess.run([str(venv / "bin" / "python"), "-c", LIGHT_CHECK], cwd=cwd, env=env,
                           text=True, capture_output=True, timeout=60)
    print(light.stdout)
    assert light.returncode == 0, light.stdout + light.stderr
    helped = subprocess.run([str(venv / "bin" / "course"), "doctor", "--help"], cwd=cwd,
                            env=env, text=True, capture_output=True, timeout=60)
    assert helped.returncode == 0 and "--no-tf" in helped.stdout, helped.stderr


def test_installed_course_doctor_passes(installed):
    t0 = time.perf_counter()
    venv, env, cwd = installed["venv"], installed["env"], installed["cwd"]
    kernel = subprocess.run([str(venv / "bin" / "course"), "kernel"], cwd=cwd, env=env,
                            text=True, capture_output=True, timeout=120)  # as the README says
    assert kernel.returncode == 0, kernel.stdout + kernel.stderr
    doctor = subprocess.run([str(installed["venv"] / "bin" / "course"), "doctor", "--no-tf"],
                            cwd=installed["cwd"], env=installed["env"], text=True,
                            capture_output=True, timeout=180)
    print(doctor.stdout, f"({time.perf_counter() - t0:.1f} s)")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "[PASS] gloo all_reduce" in doctor.stdout


def test_requires_python_agrees_with_the_code():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["requires-python"] == ">=3.11"  # tomllib is 3.11+
    assert meta["tool"]["ruff"]["target-version"] == "py311"
