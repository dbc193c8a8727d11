"""Datasets: the readers of local and Hugging Face data, the built-in arithmetic task, Math-Shepherd's step labels.
Torch-free: the web process reads it."""
