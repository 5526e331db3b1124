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
(``LabApp.news_url``, ``LabApp.check_for_updates_class``), and put this Python's ``bin/`` folder
(the course's venv) first on the lab's ``PATH``: JupyterLab's terminal inherits it, so a learner
types ``course solution 3 ex2`` there without activating the venv (:func:`lab_environment`). The
terminal's shell is started as a plain shell (:func:`server_config`): a server whose output is
not a terminal would otherwise start a login shell, whose ``/etc/profile`` resets ``PATH``.
"""

from __future__ import annotations

import json
import os
import sys
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


def server_config(shell: str | None = None) -> dict[str, dict[str, dict[str, list[str]]]]:
    """The Jupyter server's settings for both modes: terminals run ``shell`` (default
    ``$SHELL``, else ``sh``) as given, never as a login shell, so they keep the lab's ``PATH``."""
    return {"ServerApp": {"terminado_settings": {
        "shell_command": [shell or os.environ.get("SHELL") or "sh"]}}}


def write_config_dir(folder: Path, source: bool) -> Path:
    """Write ``folder/labconfig/page_config.json`` for the mode and
    ``folder/jupyter_server_config.json``; returns ``folder``."""
    for target, data in ((Path(folder) / "labconfig" / "page_config.json", page_config(source)),
                         (Path(folder) / "jupyter_server_config.json", server_config())):
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data, indent=1) + "\n"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    return Path(folder)


def lab_environment(folder: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) with ``folder`` first on ``JUPYTER_CONFIG_PATH`` and
    this Python's ``bin/`` folder (where ``course`` is installed) first on ``PATH``."""
    env = dict(os.environ if environ is None else environ)
    rest = env.get("JUPYTER_CONFIG_PATH", "")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(folder), rest) if p)
    bindir = str(Path(sys.executable).parent)  # not resolved: a venv's python is a link
    others = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir, *others])
    return env
