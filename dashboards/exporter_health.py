"""The exporter health dashboard (gpuscope-exporter): the gpuscope daemons themselves, from
scrape state and sampling to their faults, footprint, scrape cost and pod watch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.layout import Layout, dashboard, query_variable
from dashboards.panels import (
    BAD_FROM_ONE,
    Column,
    Query,
    stat,
    state_timeline,
    steps,
    table,
    timeseries,
)

if TYPE_CHECKING:
    from dashboards.panels import Json


def make() -> Json:
    scope = 'job=~"$job", node=~"$node"'
    daemon = "{{node}} {{instance}}"
    layout = Layout()

    layout.row("Targets")
    layout.add(
        4,
        4,
        stat(
            "Targets up",
            "gpuscope daemons Prometheus scraped successfully.",
            Query(f"sum(up{{{scope}}})"),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Targets down",
            "gpuscope targets Prometheus cannot scrape (GpuscopeExporterDown).",
            Query(f"count(up{{{scope}}} == 0) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Failing collectors",
            "Sources (nvml, kubernetes, podresources, cgroups, calibration) that failed in the last cycle, and background tasks (events, web_config) waiting to be restarted.",
            Query(f"count(gpuscope_collector_success{{{scope}}} == 0) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Oldest sample",
            "Age of the oldest last-finished sampling cycle among the daemons (GpuscopeSamplesStale over 2 minutes).",
            Query(f"max(time() - gpuscope_last_sample_timestamp_seconds{{{scope}}})"),
            unit="s",
            decimals=1,
            thresholds=steps(("green", None), ("orange", 10), ("red", 120)),
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Overruns in range",
            "Sampling cycles that outlasted --collect.interval during the time range.",
            Query(f"sum(increase(gpuscope_sample_overruns_total{{{scope}}}[$__range]))"),
            decimals=0,
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Kubernetes watches down",
            "Daemons' watches on the Kubernetes API (pods; ResourceSlices where DRA is on; "
            "LocalQueues where Kueue is) that are down.",
            Query(f"count(gpuscope_kubernetes_watch_up{{{scope}}} == 0) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        24,
        7,
        table(
            "Daemons",
            "Every gpuscope target: scrape state, version, age of its last sample and the cost of scraping it.",
            ("node", "instance", "version", "python_version"),
            Column(
                "Up",
                f"max by (node, instance) (up{{{scope}}})",
                mappings=((1, "up", "green"), (0, "down", "red")),
            ),
            Column(
                "",
                f"max by (node, instance, version, python_version) (gpuscope_build_info{{{scope}}})",
            ),
            Column(
                "Sample age",
                f"max by (node, instance) (time() - gpuscope_last_sample_timestamp_seconds{{{scope}}})",
                unit="s",
            ),
            Column(
                "Scrape duration",
                f"max by (node, instance) (scrape_duration_seconds{{{scope}}})",
                unit="s",
            ),
            Column("Samples", f"max by (node, instance) (scrape_samples_scraped{{{scope}}})"),
        ),
    )

    layout.row("Sampling")
    layout.add(
        12,
        8,
        state_timeline(
            "Collector success",
            "Whether each source answered in each sampling cycle.",
            Query(f"gpuscope_collector_success{{{scope}}}", "{{node}} {{collector}}"),
            states=((1, "ok", "green"), (0, "failing", "red")),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Collector duration",
            "Time each source took in the last sampling cycle.",
            Query(f"gpuscope_collector_duration_seconds{{{scope}}}", "{{node}} {{collector}}"),
            unit="s",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Sample age",
            "Seconds since each daemon last finished a sampling cycle. A hung GPU does not hold cycles up; a wedged sampler does, until /-/healthy fails and the kubelet restarts the daemon.",
            Query(f"time() - gpuscope_last_sample_timestamp_seconds{{{scope}}}", daemon),
            unit="s",
            thresholds=steps(("green", None), ("red", 120)),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Sampling cycles and overruns",
            "Cycles completed per second (1/--collect.interval when healthy) and cycles that ran late.",
            Query(
                f"rate(gpuscope_sample_cycles_total{{{scope}}}[$__rate_interval])",
                f"{daemon} cycles",
            ),
            Query(
                f"rate(gpuscope_sample_overruns_total{{{scope}}}[$__rate_interval])",
                f"{daemon} overruns",
            ),
            unit="ops",
        ),
    )

    layout.row("Faults and footprint")
    layout.add(
        8,
        8,
        timeseries(
            "GPUs down, by reason",
            "GPUs each daemon reports down (gpu_up 0) and why: lost to the driver, hung in a driver call, not opened, or an unexpected error reading them.",
            Query(
                f"sum by (node, instance, reason) (gpu_down_reason{{{scope}}})",
                f"{daemon} {{{{reason}}}}",
            ),
            stepped=True,
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Sampling errors and restarts",
            "Unexpected errors met while sampling (the log names each once), and restarts of the daemon (a wedged sampler fails /-/healthy, and the kubelet restarts it).",
            Query(
                f"increase(gpuscope_sample_errors_total{{{scope}}}[$__rate_interval])",
                f"{daemon} errors",
            ),
            Query(
                f"changes(process_start_time_seconds{{{scope}}}[$__rate_interval])",
                f"{daemon} restarts",
            ),
            stepped=True,
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Resident memory",
            "Memory each daemon holds (process_resident_memory_bytes): paid on every GPU node.",
            Query(f"process_resident_memory_bytes{{{scope}}}", daemon),
            unit="bytes",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "CPU used",
            "CPU seconds per second each daemon uses (its sampling, rendering and serving).",
            Query(f"rate(process_cpu_seconds_total{{{scope}}}[$__rate_interval])", daemon),
            unit="percentunit",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Open file descriptors",
            "File descriptors each daemon holds, as a share of its limit (connections, NVML, sockets).",
            Query(
                f"process_open_fds{{{scope}}} / process_max_fds{{{scope}}}",
                daemon,
            ),
            unit="percentunit",
        ),
    )

    layout.row("Scrapes")
    layout.add(
        12,
        8,
        timeseries(
            "Scrape duration",
            "How long Prometheus took to scrape each daemon (the daemon serves pre-rendered bytes, so this stays flat as GPUs and pods grow).",
            Query(f"scrape_duration_seconds{{{scope}}}", daemon),
            unit="s",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Samples per scrape",
            "Series each daemon exposes: grows with GPUs, processes and pods.",
            Query(f"scrape_samples_scraped{{{scope}}}", daemon),
        ),
    )

    layout.row("Kubernetes")
    layout.add(
        8,
        8,
        state_timeline(
            "Kubernetes watches",
            "Whether each daemon's list+watch of its node's pods (and, where DRA is on, "
            "ResourceSlices; where Kueue is, LocalQueues) is connected.",
            Query(f"gpuscope_kubernetes_watch_up{{{scope}}}", "{{node}} {{resource}}"),
            states=((1, "watching", "green"), (0, "down", "red")),
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Kubernetes cache age",
            "Seconds since each daemon's caches of pods (and ResourceSlices, LocalQueues) last "
            "heard from the API server.",
            Query(f"gpuscope_kubernetes_cache_age_seconds{{{scope}}}", "{{node}} {{resource}}"),
            unit="s",
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Pods cached",
            "Pods on each node the daemon knows about.",
            Query(f"gpuscope_pods_cached{{{scope}}}", "{{node}}"),
        ),
    )
    layout.add(
        24,
        6,
        table(
            "Active exporter alerts",
            "gpuscope's alerts about itself that are pending or firing.",
            ("alertname", "alertstate", "severity", "node", "instance", "collector"),
            Column(
                "",
                'sum by (alertname, alertstate, severity, node, instance, collector) (ALERTS{alertname=~"Gpuscope.*", job=~"$job"})',
            ),
        ),
    )

    return dashboard(
        "gpuscope-exporter",
        "gpuscope / Exporter health",
        "The gpuscope daemons themselves: scrape state, collectors, sampling, scrape cost and the pod watch.",
        [
            query_variable("job", "Job", "gpuscope_build_info", "job"),
            query_variable("node", "Node", 'up{job=~"$job"}', "node"),
        ],
        layout,
    )
