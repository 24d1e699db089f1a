"""The on-demand GPU trace (`--web.enable-trace`): `GET /debug/gpu-trace?seconds=N` samples the
GPUs at 10 Hz or more for N seconds, on each GPU's own worker thread, and answers Chrome's Trace
Event Format, which Perfetto opens (`endpoint`); `poll` is the driver side, `chrome` the events,
`client` the `gpuscope trace` command."""
