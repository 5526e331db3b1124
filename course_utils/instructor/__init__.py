"""The instructor's side behind the ``course`` command: release, grade, feedback, slides,
doctor, benchmarks, the figure gallery.

Learners never import these; notebooks and the learner's app (:mod:`course_utils.learner`)
do not need them.
"""
