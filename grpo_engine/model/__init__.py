"""Models: the built-in model, the model cache, .gguf conversion. Needs torch."""
