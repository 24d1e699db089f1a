"""The rightsizing job (`gpuscope rightsize`): Prometheus history -> strategy -> report; and its
server (`gpuscope rightsize serve`), which makes the report again on a schedule and serves it.

A separate program from the daemon that shares its package: it never imports the daemon's modules
(only the shared `exporter.catalog`, `exporter.documents`, `exporter.durations`,
`exporter.settings`, `exporter.series`, `exporter.supervise`, `exporter.logs`, and `exporter.web`,
the endpoint's security and listener; a contract in `pyproject.toml` checks it). Data flows one
way:

    options.py      every setting declared once (flags, variables, --config.file, the docs' table), and
                    the run's configuration: files read bounded, everything checked before a query
    prometheus.py   the PromQL HTTP API client (auth, TLS, retries, bounded concurrency, answers
                    read bounded and element by element: forged or foreign series dropped as
                    read; redirects within the origin only; the URL shown without userinfo)
    selection.py    which workloads: namespaces and a Kubernetes label selector, as PromQL
    signals.py      one PromQL template per signal, each with the bounds of what it measures
    fetch.py        every signal asked over the window and the shorter terms (per-pod ones in
                    batches of pods)
    history.py      the answers -> WorkloadHistory per workload (and per term)
    hardware.py     GPU options, prices (catalog, overridable by a YAML price file), ceilings
                    (calibrated from Prometheus, else datasheet)
    settings.py     the strategy's settings: their rows of the settings table, how reports show them
    strategy.py     pure, registered by name: history + hardware + settings -> Recommendation
    confidence.py   pure: how far to trust a recommendation, the terms' answers and the trend
    names.py        Kubernetes' naming rules for names from labels; text fit for a comment line
    patches.py      pure: the strategic-merge patch that applies a recommendation to its owner
    consolidation.py  pure bin-packing of recommended demands onto GPUs, MIG layouts included
    report.py       recommendations + money + confidence + patches + consolidation -> Report
    formatters/     Report -> table | json | yaml | csv | markdown | html, one module per format
                    (html from Jinja2 templates; plots.py lays out its two SVG plots), and the
                    patches directory
    configmap.py    writes the report into a ConfigMap (the weekly CronJob)
    notify.py       a summary posted to Slack, Teams or any JSON webhook
    cli.py          `gpuscope rightsize`: the run, its output, notifications and exit status
    server.py       `gpuscope rightsize serve`: refreshes, the page, JSON, patches and metrics
"""
