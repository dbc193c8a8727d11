"""The benchmarks: scripts that print the figures (speed, memory, accuracy) the docs quote; none is a test.

Run one as a module from the repository root, e.g.::

    .venv/bin/python -m bench.accuracy_rise --help
    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/grpo-cache

bench/README.md lists them and what each prints. The pieces several of them share (the SmolLM2 model and its word
problems, a dashboard started for a bench, the CPU's name and peak memory, the recorders the engine is timed with,
child processes, the PASS / FAIL line) are in ``bench.harness``; a script imports them, and its siblings, as
``from bench.harness import ...``. bench/run_digest.py is the exception: it runs as a file from another checkout
(its docstring says how).
"""
