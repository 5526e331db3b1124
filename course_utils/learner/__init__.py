"""The learner's app behind ``course lab``: the working folder of their copies
(:mod:`.workspace`), the generated home page (:mod:`.home`), the course's Jupyter kernel
(:mod:`.kernelspec`), the guard in JupyterLab's cluster panel (:mod:`.labpanel`), and the
``course lab`` / ``home`` / ``solution`` / ``kernel`` plumbing (:mod:`.lab`).

Built on the cluster layer and :mod:`course_utils.assignments` (the released copies); it never
imports the instructor's tools.
"""
