"""Policy replay (`gpuscope rightsize --simulate`): what each sharing policy would have needed,
step by step over the report's window.

`policies.py` names the policies; `steps.py` asks the PromQL API for each workload's demand at
every step (and the GPUs held, and the steps a shared GPU was contended); `placement.py` is the
pure search that puts per-step demand vectors on GPUs; `engine.py` replays each policy over the
report's workloads; `run.py` joins the report's rows and the per-step history for it;
`summary.py` says the result as JSON, in a line per policy and in a sentence; `patchset.py`
and `express.py` write the winning placement as patches where Kubernetes can express it;
`cut.py` stops a replay part-way (the report server's shutdown, a refresh's deadline).
"""
