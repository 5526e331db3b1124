"""Where the lesson notebooks are, and reading one (the source: solutions and hidden tests in)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from ..settings import data_dir

NOTEBOOK_DIR: Path = data_dir("notebooks")  # the checkout's, or the installed package's copy


def source_notebooks() -> list[Path]:
    """Every lesson notebook, in unit order."""
    return sorted(p for p in NOTEBOOK_DIR.glob("*.ipynb") if ".ipynb_checkpoints" not in str(p))


def read(path: str | os.PathLike[str]) -> NotebookNode:
    """A notebook file as an nbformat v4 node."""
    return nbformat.read(str(path), as_version=4)
