"""The instructor's side behind the ``course`` command: grading, doctor, benchmarks.

Learners never import these; notebooks do not need them.
"""
