"""The training workload every cell runs: tiny models, adapters, FSDP wrapping, training and post-training checks."""
