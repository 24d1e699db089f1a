"""`gpuscope calibrate`: measure what this GPU type really achieves, with reference PyTorch kernels.

Needs PyTorch, which the `calibrate` extra brings (rich, for its progress bars, and the Kubernetes
client, for the ConfigMap, are gpuscope's own dependencies); the command line imports this
package only when `calibrate` runs, and the daemon never does. Profiles it writes are read by
`exporter.calibration`, which needs none of those.

- `method`: warm-up, trial sizing, timing (CUDA events or the monotonic clock), median and spread
- `kernels`: the reference workloads (matmul per dtype, memory, transfers, launches)
- `device`: which device, its name and caches, NVML readings before and after
- `run`: the plan (sizes per device and mode) and the run that builds the profile
- `progress`: rich bars on a terminal, log lines otherwise
- `configmap`: merge a profile into a ConfigMap, keyed by model
- `options`: the settings (flags, `GPUSCOPE_CALIBRATE_*`, `--config.file`), checked without
  importing PyTorch
- `command`: the run once the settings are checked
"""
