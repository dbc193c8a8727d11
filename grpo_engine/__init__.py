"""The GRPO engine (DeepSeekMath, arXiv 2402.03300, section 4.1), in rooms by concept.

Torch-free, read by the web process: ``spec`` (the run spec and its checks), ``data`` (datasets, the built-in
task), ``rewards`` (the verifier, named and custom rewards, the step checker) and ``report`` (the recorder
interface, the metric registry, trackers). Needing torch, loaded only by the workers: ``algo`` (the objective's
equations), ``rollout`` (sampling, tokenization, the outputs' log-probs), ``rm`` (learned reward models), ``train``
(the outer loop, one step, loading, checkpoints) and ``model`` (the built-in model, .gguf conversion).

Importing this package is cheap: torch is imported only by the torch rooms' modules. The engine knows nothing of
the database, Celery or Gradio; it reports through :class:`grpo_engine.report.recorder.Recorder`.
"""
