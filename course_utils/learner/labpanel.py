"""The IPython Parallel panel in ``course lab``: it lists the course's cluster, and says why its
STOP button does not stop it.

ipyparallel's JupyterLab extension lists every cluster file in every IPython profile, so the
cluster ``course lab`` started (profile ``course``, cluster id ``course``) shows up as
``course:course`` with its state and engine count. Its STOP button would stop the controller
and engines under ``course lab`` and every open notebook, and START would then make a plain
ipyparallel cluster with another id and none of the course's settings. So ``course lab`` loads
this small Jupyter server extension: for the course's own cluster, STOP and START answer 409
with the reason and what to do instead, which the panel shows in its error dialog. Other
clusters (and listing) pass through to ipyparallel untouched.
"""

from __future__ import annotations

import os
from typing import Any

from .. import settings

#: What the panel's error dialog says for the course's cluster.
REASON = ("This cluster belongs to `course lab`, which started it for every notebook: it stops "
          "when course lab stops (Ctrl-C in its terminal). To replace stuck engines, run "
          "cu.restart() in a notebook; to start over, stop course lab and run it again.")
EXTENSION = "course_utils.learner.labpanel"


def course_cluster_key() -> str:
    """The panel's key for the course cluster: ``<IPython profile>:<cluster id>``."""
    return f"{settings.ipython_profile()}:{settings.cluster_id()}"


def jupyter_args() -> list[str]:
    """The ``jupyter lab`` option that loads this extension."""
    return [f"--ServerApp.jpserver_extensions={EXTENSION}=True"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": EXTENSION}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.utils import url_path_join
    from tornado import web

    try:
        from ipyparallel.nbextension.handlers import ClusterActionHandler
    except ImportError:  # no ipyparallel panel: nothing to guard
        return

    class CourseClusterGuard(ClusterActionHandler):
        """ipyparallel's per-cluster handler, refusing STOP/START for the course's cluster."""

        def _refuse(self, cluster_key: str) -> None:
            if cluster_key == course_cluster_key():
                raise web.HTTPError(409, REASON)

        @web.authenticated
        async def delete(self, cluster_key: str) -> None:
            self._refuse(cluster_key)
            await super().delete(cluster_key)

        @web.authenticated
        async def post(self, cluster_key: str) -> None:
            self._refuse(cluster_key)
            await super().post(cluster_key)

    base = serverapp.web_app.settings["base_url"]
    # Extensions load in name order, so this rule comes before ipyparallel's identical one.
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, r"/ipyparallel/clusters/(?P<cluster_key>[^/]+)"),
         CourseClusterGuard)])
    serverapp.log.info("course: the IPython Parallel panel cannot stop %s (course lab's, pid %s)",
                       course_cluster_key(), os.getppid())
