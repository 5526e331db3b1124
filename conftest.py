"""Shared test set-up: isolate the test clusters from a learner's running ``course lab``."""

from __future__ import annotations

import os
import tempfile

# Notebook kernels (nbval) inherit this environment, so they use the test cluster id, too.
os.environ.setdefault("COURSE_CLUSTER_ID", "pytest")
os.environ.setdefault("IPP_NONINTERACTIVE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `course lab` in tests works in a throw-away learner's folder, never in ~/dist-training-course.
os.environ.setdefault("COURSE_WORKDIR", os.path.join(
    tempfile.gettempdir(), f"course-workdir-{os.environ['COURSE_CLUSTER_ID']}"))


def pytest_sessionstart(session) -> None:
    # The course's Jupyter kernel, as `course lab` / `make lab` install it: `course doctor`
    # checks it. Idempotent (nbval runs notebooks with --nbval-current-env, not through it).
    from course_utils.instructor import kernelspec

    kernelspec.install()
