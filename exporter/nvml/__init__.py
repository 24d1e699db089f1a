"""NVML: the driver boundary, the sampler built on it, and the simulator that stands in for it."""
