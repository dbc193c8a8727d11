"""What a run reports: the recorder interface, the metric registry, the external trackers. Torch-free."""
