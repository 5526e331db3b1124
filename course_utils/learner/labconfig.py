"""What ``course lab``'s JupyterLab shows besides the notebooks: no news question, and for a
learner none of nbgrader's instructor tools.

nbgrader's JupyterLab extension adds the "Create Assignment" sidebar, an "Nbgrader" menu (the
formgrader, the course list) and an assignments panel for an nbgrader exchange. A learner's
``course lab`` needs none of them: their notebooks come from the working folder, and their
tests run in the notebook. So it disables those plugins through a page config
(``labconfig/page_config.json`` in a folder put first on ``JUPYTER_CONFIG_PATH``, the place
JupyterLab reads ``disabledExtensions`` from), kept for ``course lab`` alone: a plain
``jupyter lab`` and the instructor's ``course lab --source`` keep them. nbgrader's
"Validate" button stays: it runs the notebook the way a grader would.

Both modes also turn off JupyterLab's question "Would you like to get notified about official
Jupyter news?" (its plugin, :data:`NEWS_PLUGIN`) and its update check
(``LabApp.news_url``, ``LabApp.check_for_updates_class``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

#: nbgrader's instructor and exchange plugins, hidden in a learner's lab.
INSTRUCTOR_PLUGINS = (
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:menu",
    "@jupyter/nbgrader:course-list",
    "@jupyter/nbgrader:assignment-list",
)
#: JupyterLab's news question ("Would you like to get notified about official Jupyter news?"):
#: its plugin asks even with ``LabApp.news_url=None`` (seen in the browser test), so both modes
#: disable it.
NEWS_PLUGIN = "@jupyterlab/apputils-extension:announcements"
#: ``jupyter lab`` options for both modes: no news feed, no update check.
QUIET_ARGS = ("--LabApp.news_url=None",
              "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")


def page_config(source: bool) -> dict[str, dict[str, bool]]:
    """The page config ``course lab`` serves: the instructor's tools off unless ``source``."""
    hidden = (NEWS_PLUGIN,) if source else (NEWS_PLUGIN, *INSTRUCTOR_PLUGINS)
    return {"disabledExtensions": dict.fromkeys(hidden, True)}


def write_config_dir(folder: Path, source: bool) -> Path:
    """Write ``folder/labconfig/page_config.json`` for the mode; returns ``folder``."""
    target = Path(folder) / "labconfig" / "page_config.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(page_config(source), indent=1) + "\n"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return Path(folder)


def lab_environment(folder: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) with ``folder`` first on ``JUPYTER_CONFIG_PATH``."""
    env = dict(os.environ if environ is None else environ)
    rest = env.get("JUPYTER_CONFIG_PATH", "")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(folder), rest) if p)
    return env
