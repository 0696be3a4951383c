"""Benchmarks: `python -m interlace.bench all_gather`. Each op is checked for correctness and then
timed against its baselines in the same run, on the same GPUs."""
