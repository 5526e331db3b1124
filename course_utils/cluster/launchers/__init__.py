"""*Starts processes*: the controller and engines (:mod:`.launching`), for the local profile
forked from one server (:mod:`.fork_client` in the process that starts them,
:mod:`.ipyparallel_fork_server` the server itself, :mod:`.fork_protocol` what they say), on SSH
hosts (:mod:`.ssh`) and as a Slurm job (:mod:`.slurm`, :mod:`.slurm_queue`,
:mod:`.slurm_script`)."""
