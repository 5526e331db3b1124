"""*Runs in each engine process*: what the kernel calls on an engine (:mod:`.engine`: its report
about itself, its rank, the learner's ``%%px`` names), the engine process's entry point
(:mod:`.ipyparallel_engine`) and the application of an engine forked from a server
(:mod:`.forked_engine_app`). No torch or TensorFlow here."""
