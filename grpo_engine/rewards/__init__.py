"""Judging outputs: the verifier, the named and custom rewards, the step checker, and the previews' subprocesses.
Torch-free: the web process reads it."""
