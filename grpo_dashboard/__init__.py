"""The ``grpo-dashboard`` command (the top layer: it starts the web app and the workers)."""
