"""A workshop of many learners on GPU hosts: the workshop file (:mod:`.plan`), the files it
turns into (:mod:`.render`), the learners' environment without the source notebooks
(:mod:`.learner_env`), the hub's hook that gives each learner their own working folder
(:mod:`.hub`), ``course workshop check`` (:mod:`.check`) and ``course workshop collect``
(:mod:`.collect`). The instructor's side only: no notebook imports it (docs/instructor.md, "A
workshop on two GPU hosts")."""
