"""The lesson notebooks as nbgrader assignments: where they are (:mod:`.lessons`), their
student version as ``nbgrader generate_assignment`` makes it (:mod:`.release`), and the
nbgrader configuration and preprocessors the course adds (:mod:`.nbgrader_setup`).

Below both users of a release: the instructor's tools (``course release``, ``grade``, ``slides``)
and the learner's app (``course lab`` gives learners the released copy).
"""
