"""The hub's spawner: JupyterHub's local-process spawner whose lab starts inside the learner's
memory cgroup (:mod:`.lab_limits` says why and how); ``jupyterhub_config.py`` from
:mod:`.render` names it."""

from __future__ import annotations

import os
from collections.abc import Callable

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer

from .lab_limits import prepare_group


class LimitedSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` whose lab starts inside the learner's memory group."""

    memory_max = Integer(0, help="Bytes a learner's lab and its kernels may hold together; 0: "
                                 "no limit").tag(config=True)

    async def start(self):  # noqa: ANN201 - JupyterHub's signature
        self._procs_file = None
        if self.memory_max:
            self._procs_file = prepare_group(self.user.name, self.memory_max)
        return await super().start()

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        drop_root = super().make_preexec_fn(name)
        procs_file = getattr(self, "_procs_file", None)

        def preexec() -> None:
            if procs_file is not None:  # still root: join the group, then become the learner
                with open(procs_file, "w") as f:
                    f.write(str(os.getpid()))
            drop_root()

        return preexec
