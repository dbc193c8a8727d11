"""The run spec's keys, one module per Launch-form section; grpo_engine.spec.run_spec.RunSpec gathers them."""
