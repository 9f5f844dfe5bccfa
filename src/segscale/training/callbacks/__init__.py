"""The Lightning callbacks of ``conf/callbacks`` and of the run: one concept per module.

``checkpoints`` (best and last, periodic, a resume's best), ``learning_rate`` (applied on
a resume, monitored), ``training_progress`` (the bar, the verbose table, the figure),
``unreadable_tiles`` (left out, or the run stops), ``preemption_stop``, ``run_summary``
(``summary.json``, a relaunch's record), ``validation_report``, ``ema``,
``encoder_freeze``, ``threads_follow_machine``, ``trial_pruning``. Their ``_target_``
paths in ``conf/callbacks`` name the modules; nothing is re-exported here, so that a run
imports only the callbacks it builds.
"""
