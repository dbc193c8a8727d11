"""The shared core: settings, paths and their roots, login, the broker client, the run-status words and the one
admission of a run. Imports only the engine's torch-free modules."""
