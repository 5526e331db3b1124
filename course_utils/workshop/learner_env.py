"""The learners' environment of a workshop: the course's code without the instructor's source.

``pip install .`` puts the source notebooks (every solution, every hidden test) under
``<prefix>/share/dist-training-course/notebooks``, and an editable install reads them from the
checkout; a learner whose lab ran in that environment could read them, and ``course solution``
would print them. So ``course workshop`` builds a second, small environment for the labs
(:func:`build_learner_env`, into ``<out>/learner-env``)::

    learner-env/bin/python              a venv of the same Python (no pip of its own)
    learner-env/lib/.../course_utils/   a copy of the package: code only
    lib/.../course-shared.pth           the instructor environment's site-packages (torch,
                                        TensorFlow, ipyparallel, JupyterLab), read-only
    share/dist-training-course/profiles the cluster profiles (no ``notebooks/``)
    share/jupyter/kernels/...           the course's kernel, this environment's Python
    share/jupyter/lab, ...              JupyterLab's files: links into the shared environment
    etc/jupyter/                        its server extensions, and the learner's page config

The ``.pth`` file names the shared site-packages as a plain path, so Python does not run the
``.pth`` files found there: the editable install's hook (which would import the checkout's
package) stays out. The hub's ``Spawner.cmd`` runs ``learner-env/bin/python -m
jupyterhub.singleuser``; the learners' kernels and the engines Slurm starts for them use the
same interpreter. On two hosts the folder must be at the same path on both (a shared file
system, or copied). Introduced in docs/instructor.md, "A workshop on two GPU hosts".
"""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from ..errors import CourseError
from ..settings import DATA_SUBDIR, ENV_KERNEL_PREFIX, course_root, data_dir

FOLDER = "learner-env"
SHARED_PTH = "course-shared.pth"


def _site_packages(prefix: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    return prefix / rel


def _copy_package(dest: Path) -> None:
    """The package's code, byte-compiled here: learners cannot write into it, so without the
    cache every kernel and engine of theirs would compile it again."""
    src = course_root() / "course_utils"
    shutil.copytree(src, dest / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    compileall.compile_dir(str(dest / "course_utils"), quiet=1)


def _jupyter_files(env: Path) -> None:
    """JupyterLab's server extensions (``etc/jupyter``) and its application and extensions
    (``share/jupyter``) are found under ``sys.prefix``: without them the labs would be bare
    Jupyter Servers. The config is copied (plus the learner's page config: nbgrader's
    instructor tools hidden, as ``course lab`` does); the shared files are linked, but for
    ``kernels``: the course kernel here runs this environment's Python."""
    from ..learner.labconfig import write_config_dir

    mine = Path(sys.prefix)
    if (mine / "etc" / "jupyter").is_dir():
        shutil.copytree(mine / "etc" / "jupyter", env / "etc" / "jupyter", symlinks=True)
    write_config_dir(env / "etc" / "jupyter", source=False)
    share = env / "share" / "jupyter"
    share.mkdir(parents=True, exist_ok=True)
    if (mine / "share" / "jupyter").is_dir():
        for entry in (mine / "share" / "jupyter").iterdir():
            if entry.name != "kernels":
                (share / entry.name).symlink_to(entry)


def build_learner_env(out: Path, python: str = sys.executable) -> Path:
    """Make (or make again: the course's code as it is now) ``out/learner-env``; its Python."""
    env = Path(out).resolve() / FOLDER
    if env.exists():
        shutil.rmtree(env)
    done = subprocess.run([python, "-m", "venv", "--without-pip", str(env)],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise CourseError(f"could not make the learners' environment {env}: "
                          f"{done.stderr.strip()[-500:]}",
                          "check that the folder is writable and that `python -m venv` works")
    site = _site_packages(env)
    shared = [p for p in dict.fromkeys([sysconfig.get_path("purelib"),
                                        sysconfig.get_path("platlib")]) if p]
    (site / SHARED_PTH).write_text("\n".join(shared) + "\n")
    _copy_package(site)
    profiles = env / DATA_SUBDIR / "profiles"
    shutil.copytree(data_dir("profiles"), profiles)
    _jupyter_files(env)
    py = env / "bin" / "python"
    course = env / "bin" / "course"
    course.write_text(f"#!{py}\nimport sys\nfrom course_utils.cli import main\n"
                      "sys.exit(main())\n")
    course.chmod(0o755)
    kernel = subprocess.run([str(py), "-m", "course_utils.cli", "kernel"], capture_output=True,
                            text=True, timeout=120, check=False,
                            env={k: v for k, v in os.environ.items()
                                 if k not in (ENV_KERNEL_PREFIX, "PYTHONPATH")})
    if kernel.returncode != 0:
        raise CourseError(f"the learners' environment {env} does not run the course: "
                          f"{(kernel.stdout + kernel.stderr).strip()[-800:]}",
                          "run `course doctor` in the instructor's environment first")
    for folder, _, files in os.walk(env):  # every learner reads and runs it, nobody writes it
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
    return py


def source_places() -> list[Path]:
    """Where the instructor's environment keeps the source notebooks (what learners must not
    read): the checkout's ``notebooks/`` and an installed copy under ``share/``."""
    places = [course_root() / "notebooks"]
    for prefix in dict.fromkeys([sysconfig.get_path("data"), sys.prefix]):
        places.append(Path(prefix) / DATA_SUBDIR / "notebooks")
    return [p for p in dict.fromkeys(places) if p.is_dir()]
