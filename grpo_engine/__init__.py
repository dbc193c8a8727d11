"""The GRPO engine (DeepSeekMath, arXiv 2402.03300, section 4.1).

Importing this package is cheap: torch and transformers are imported by the
submodules that need them (``objective``, ``model``, ``trainer``), so the web
process can read the run spec from :mod:`grpo_engine.config` without loading torch.
The engine knows nothing of the database, Celery or Gradio; it reports through
:class:`grpo_engine.recorder.Recorder`.
"""
