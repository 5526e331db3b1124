"""A private working folder for a test that runs a notebook again while nbval, or another test
on the other xdist worker, may run the same notebook at the same time.

The notebooks write next to themselves, relative to the kernel's working directory: unit 6's
``train_ddp.py`` (``%%writefile``) and every checkpoint under ``saved_models/``. Two runs in
``notebooks/`` at once overwrite each other's script and checkpoints (a planted mistake's
script reached the two-host test's ``torchrun`` that way). A run in a folder of its own writes
there; ``data/`` (the dataset cache) and the notebooks themselves are links to the checkout's.
"""

from __future__ import annotations

from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def private_notebook_dir(folder: Path) -> Path:
    """``folder`` (created) set up as a notebook working directory; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    (NOTEBOOK_DIR / "data").mkdir(exist_ok=True)
    for src in [NOTEBOOK_DIR / "data", *sorted(NOTEBOOK_DIR.glob("*.ipynb"))]:
        link = folder / src.name
        if not link.exists():
            link.symlink_to(src)
    return folder
