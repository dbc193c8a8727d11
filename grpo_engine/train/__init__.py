"""A run: the outer loop (trainer), one step, loading, checkpoints, data parallelism, the learning-rate schedule.
Needs torch."""
