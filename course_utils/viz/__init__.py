"""Figures of the course: pure functions of recorded arrays; none talks to a cluster.

Record on the engines (``course_utils.torch_dist.record`` and ``.live_log``, ``tf_dist.record``),
``cluster.pull`` or ``cluster.run`` the arrays, then plot here (so figures are testable without
engines and can be replayed in slides). Each function returns a matplotlib ``Figure`` drawn with
the palette of :mod:`.style`. Introduced in ``01_collectives`` (``per_rank_tensors``,
``bandwidth_bars``, ``ring_trace``, ``ring_replay``, ``collectives_cheatsheet``),
``02_data_parallel_from_scratch`` (``replica_divergence``), ``03_pytorch_ddp``
(``per_rank_curves``, ``ddp_timeline``, ``live``), ``04_tf_classic_ps`` and
``05_tf2_parameter_server_strategy`` (``ps_traffic`` and friends; the pictures of the
learner's own TF cluster in :mod:`.tf_pictures`) and the performance unit (``cost_model``) and
``10_sharding_and_memory`` (``memory_bars``, ``memory.fsdp_lifecycle``) and
``11_tensor_and_pipeline`` (``pipeline_schedule``).
Pictures of the learner's own cluster and step (:mod:`.pictures`): ``cluster_picture``
(``00_cluster_tour``), ``data_parallel_picture`` (``02``). ``show(fig)`` displays a figure once
and closes it (one line per figure in a notebook).
"""

from __future__ import annotations

from . import cheatsheet, cost, live, memory, ps, ring, style, tf_pictures, timeline
from .cheatsheet import collectives_cheatsheet
from .collectives import bandwidth_bars, per_rank_tensors, ring_trace
from .cost import cost_model, describe_fit, fit_alpha_beta, predict, sweep_compare
from .live import LiveFigure, live_training, watch
from .memory import memory_bars
from .pictures import cluster_picture, data_parallel_picture
from .pipeline import pipeline_schedule
from .ps import closure_timeline, placement_diagram, ps_step_timeline, ps_traffic, staleness
from .ring import replay_frames, ring_frame, ring_replay
from .style import show
from .tf_pictures import coordinator_queue, ps_cluster, ps_vs_all_reduce
from .timeline import ddp_timeline, launched_during_backward, overlap_dp_timeline, overlap_fraction
from .training import per_rank_curves, replica_divergence, sampler_counts, sampler_epochs

__all__ = ["LiveFigure", "bandwidth_bars", "cheatsheet", "closure_timeline", "cluster_picture",
           "collectives_cheatsheet", "coordinator_queue", "cost", "cost_model",
           "data_parallel_picture", "ddp_timeline", "describe_fit", "fit_alpha_beta", "live",
           "launched_during_backward", "live_training", "memory", "memory_bars",
           "overlap_dp_timeline", "overlap_fraction", "per_rank_curves", "per_rank_tensors",
           "pipeline_schedule", "placement_diagram", "predict", "ps", "ps_cluster",
           "ps_step_timeline", "ps_traffic",
           "ps_vs_all_reduce", "replay_frames", "replica_divergence", "ring", "ring_frame",
           "ring_replay", "ring_trace", "sampler_counts", "sampler_epochs", "show", "staleness",
           "style", "sweep_compare", "tf_pictures", "timeline", "watch"]
