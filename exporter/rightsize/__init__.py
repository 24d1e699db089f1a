"""The rightsizing job (`gpuscope rightsize`): Prometheus history -> strategy -> report.

A separate program from the daemon that shares its package: it never imports the daemon's modules
(only `exporter.catalog`, `exporter.durations` and `exporter.logs`; a contract in
`pyproject.toml` checks it). Data flows one way:

    prometheus.py   the PromQL HTTP API client (auth, TLS, retries, bounded concurrency)
    selection.py    which workloads: namespaces and a Kubernetes label selector, as PromQL
    history.py      one PromQL template per signal -> WorkloadHistory per workload
    hardware.py     GPU options, prices (catalog, overridable by a YAML price file), ceilings
                    (calibrated from Prometheus, else datasheet)
    settings.py     the strategy's settings table: flags, bounds, README
    strategy.py     pure, registered by name: history + hardware + settings -> Recommendation
    consolidation.py  pure bin-packing of recommended demands onto GPUs, MIG layouts included
    report.py       recommendations + money + consolidation -> Report
    formatters.py   Report -> table | json | yaml | csv | markdown | html (svg.py draws the plots)
    configmap.py    writes the report into a ConfigMap (the weekly CronJob)
    cli.py          `gpuscope rightsize` arguments and the run
"""
