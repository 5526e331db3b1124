"""Shared test set-up: isolate the test clusters from a learner's running ``course lab``."""

from __future__ import annotations

import os

# Notebook kernels (nbval) inherit this environment, so they use the test cluster id, too.
os.environ.setdefault("COURSE_CLUSTER_ID", "pytest")
os.environ.setdefault("IPP_NONINTERACTIVE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
