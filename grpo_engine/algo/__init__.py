"""The algorithm's equations on tensors: the GRPO objective and its variants, the overlong mask and penalty,
dynamic sampling. Needs torch."""
