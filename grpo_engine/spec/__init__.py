"""The run spec and what launch checks of it: RunSpec and its keys, values, cross-field checks, the Hub check and
the memory estimate. Torch-free: the web process reads it."""
