"""Errors that name their cause and the fix.

Every failure a learner can meet in the cluster layer is raised as a :class:`CourseError`
subclass whose message ends with a ``Fix:`` line, so a notebook shows one readable line
instead of a traceback from deep inside ipyparallel, torch or TensorFlow.
"""

from __future__ import annotations


class CourseError(RuntimeError):
    """Base class: ``cause`` says what went wrong, ``fix`` says what to do about it."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(f"{cause}\nFix: {fix}")

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing the full traceback: learners see the message only.
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self.cause}", f"Fix: {self.fix}"]


class EnginesDidNotStart(CourseError):
    """Engines never registered with the controller within the start timeout."""


class ClusterNotRunning(CourseError):
    """An operation needs a cluster but none is started or reachable."""


class ClusterTimeout(CourseError):
    """A call on the engines did not finish in time (often: a collective is stuck)."""


class WorldSizeMismatch(CourseError):
    """The requested world size does not match the engines the cluster has."""


class PortInUse(CourseError):
    """A requested port is already bound on the host that must listen on it."""


class BackendUnavailable(CourseError):
    """A requested backend cannot run here (e.g. nccl without a GPU on every rank)."""


class ProfileError(CourseError):
    """A cluster profile is malformed or names something that does not exist."""


class EngineError(CourseError):
    """Code raised on one or more engines; the message carries each rank's error."""


class CollectiveMismatch(CourseError):
    """Ranks called different collectives, or the same one with different shapes or dtypes."""


class ProcessGroupGone(CourseError):
    """A process group timed out or lost a rank: it cannot be used again."""
