"""*Runs in the notebook's kernel* (or ``course lab``, or the grader): the client side of a
cluster. Starting, joining, restarting and stopping it (:mod:`.lifecycle`), calls on its ranks
(:mod:`.course_cluster`), the ipyparallel client internals those calls need
(:mod:`.controller`), ``%%px`` output labelled by rank (:mod:`.pxoutput`) and a ``%%px`` cell
that fails fast (:mod:`.pxwait`), calls that time out and where each rank is stuck
(:mod:`.stuck_calls`), errors from the engines (:mod:`.remote_errors`, :mod:`.failures`), this
kernel's current cluster (:mod:`.registry`), the cluster file (:mod:`.cluster_files`), one
cluster shared by several kernels (:mod:`.sharing`), what listens where (:mod:`.exposure`) and a
cluster that is gone (:mod:`.stopped`)."""
