"""Sampling and reading outputs: the decode loop, tokenization, the outputs' log-probs and verdicts, the training
forwards, rollout step labels. Needs torch."""
