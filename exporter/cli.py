"""`gpuscope` command line: `serve` (the daemon), `calibrate` (the calibration job, which imports
PyTorch only when it runs), `rightsize` (the rightsizing job, imported only when it runs) and
`trace` (a daemon's GPU trace saved for Perfetto).

Exit status: 0 after a clean stop (SIGTERM/SIGINT) or a finished calibration, 1 when the work
cannot be done (no NVML library, port in use, no GPU, ConfigMap not writable), 2 for bad
configuration (a listen address that does not resolve among it) and for a job whose extra is not
installed (`gpuscope[rightsize]`, `gpuscope[calibrate]`: the core install is the daemon's). Each
failure is one line on stderr; a command line argparse refuses has the command's usage above it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from exporter import __version__, config, extras, logs, malloc
from exporter.app import App
from exporter.attribution import cluster_configured
from exporter.catalog import Catalog, CatalogError, catalog_from_file
from exporter.config import ConfigError, ServeConfig
from exporter.extras import MissingExtra
from exporter.nvml.driver import NvmlDriver, NvmlUnavailable, system_driver
from exporter.settings import CommandParser
from exporter.trace import client as trace_client
from exporter.web.config import WebConfigError
from exporter.web.security import WebSecurity
from exporter.web.serving import CannotListen, listen, resolve, serve_until_stopped

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence

    from exporter.attribution import ClusterAccess

log = logging.getLogger("exporter")

SWITCH_INTERVAL_SECONDS: Final = 0.001
SHUTDOWN_SECONDS: Final = 5.0
"""The whole stop on SIGTERM, under one deadline: requests being answered get all but its last
second, while sampling (its cycle in flight, NVML's shutdown) and the pod watch stop beside them.
The chart's `terminationGracePeriodSeconds` (10) leaves room for the interpreter's exit."""


def build_parser(*, calibrate_flags: bool = True) -> argparse.ArgumentParser:
    """The command line; `calibrate`'s own flags only with `calibrate_flags` (only `gpuscope
    calibrate` parses them, and `gpuscope serve` need not import them)."""
    parser = CommandParser(
        prog="gpuscope",
        description="GPU monitoring and rightsizing for shared Kubernetes GPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the per-node daemon: sample GPUs, serve Prometheus metrics",
        description="Sample every GPU through NVML and serve Prometheus metrics. Every flag "
        "can also be set by its environment variable or in the --config.file YAML.",
    )
    config.add_arguments(serve)
    calibrate = commands.add_parser(
        "calibrate",
        help="measure what this GPU type really achieves (needs gpuscope[calibrate])",
        description="Run reference PyTorch kernels on one GPU (or the CPU) and write a "
        "calibration profile: matmul rate per dtype, memory and host-device bandwidth, launch "
        "latency, beside the datasheet figures. `gpuscope serve --calibration.path` exports it.",
    )
    if calibrate_flags:
        # The calibration job's settings are imported only for `calibrate`: the daemon never
        # loads them.
        from exporter.calibrate import options as calibrate_options  # noqa: PLC0415 - see above

        calibrate_options.add_arguments(calibrate)
    trace = commands.add_parser(
        "trace",
        help="save a few seconds of a daemon's GPUs at 10 Hz or more, for Perfetto",
        description="Ask a daemon run with --web.enable-trace for a GPU trace "
        "(/debug/gpu-trace) and save it to a file that ui.perfetto.dev opens.",
    )
    trace_client.add_arguments(trace)
    commands.add_parser(
        "rightsize",
        add_help=False,
        help="recommend per workload what GPU it should run on, from Prometheus history "
        "(see gpuscope rightsize --help)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["rightsize"]:
        try:
            extras.require("rightsize")
        except MissingExtra as error:
            return _fail(str(error), 2, command="rightsize")
        # Imported only here, so the daemon never loads the rightsizing job's code.
        from exporter.rightsize.cli import main as rightsize  # noqa: PLC0415 - see above

        return rightsize(arguments[1:])
    parser = build_parser(calibrate_flags=arguments[:1] == ["calibrate"])
    args = parser.parse_args(arguments)
    if args.command == "serve":
        return serve(args)
    if args.command == "calibrate":
        return calibrate(args)
    if args.command == "trace":
        return trace_client.run(args)
    parser.print_help(sys.stderr)
    return 2


def _fail(message: str, status: int, *, command: str = "") -> int:
    print(f"gpuscope{' ' if command else ''}{command}: error: {message}", file=sys.stderr)
    return status


def serve(args: argparse.Namespace) -> int:
    flags = {key: value for key, value in vars(args).items() if key != "command"}
    malloc.fewer_arenas(os.environ)
    try:
        settings = config.load(flags)
        driver = open_driver(settings)
        cluster = open_cluster(settings, os.environ)
        if cluster is None:
            for flag, wanted in (
                ("--kubernetes.node-condition", settings.node_condition),
                ("--kubernetes.events", settings.events),
            ):
                if wanted:
                    raise ConfigError(
                        flag, "needs a cluster (--kubeconfig, the service account or $KUBECONFIG)"
                    )
    except (ConfigError, BadFleet) as error:
        return _fail(str(error), 2)
    try:
        catalog = catalog_from_file(settings.catalog_file)
    except CatalogError as error:
        return _fail(f"invalid --catalog.file: {error}", 2)
    try:
        security = WebSecurity.load(settings.web_config_file, max_requests=settings.max_requests)
    except WebConfigError as error:
        return _fail(f"invalid --web.config.file {settings.web_config_file}: {error}", 2)
    logs.configure(settings.log_level, settings.log_format)
    return asyncio.run(_serve(settings, driver, catalog, cluster, security))


def calibrate(args: argparse.Namespace) -> int:
    from exporter.calibrate import options as calibrate_options  # noqa: PLC0415 - see build_parser

    try:
        options = calibrate_options.parse(args)
    except calibrate_options.OptionError as error:
        return _fail(str(error), 2)
    try:
        extras.require("calibrate")
    except MissingExtra as error:
        return _fail(str(error), 2, command="calibrate")
    # PyTorch is imported here only: the daemon never loads it.
    from exporter.calibrate import command  # noqa: PLC0415

    try:
        return command.run(options)
    except command.CommandError as error:
        return _fail(str(error), error.status)


class BadFleet(Exception):
    """`--simulate`'s fleet cannot be simulated; `str()` is the fleet's one-line error."""


def open_driver(settings: ServeConfig) -> NvmlDriver:
    """The real NVML, or the simulator when `--simulate` is given."""
    if settings.simulate is None:
        return system_driver()
    # The simulator (~2 MiB) is imported only to simulate: a GPU node never loads it.
    from exporter.simulator import FleetError, SimulatedNvml, default_fleet, load_fleet  # noqa: PLC0415

    try:
        if settings.simulate.isdigit():
            return SimulatedNvml(default_fleet(int(settings.simulate)))
        return SimulatedNvml(load_fleet(Path(settings.simulate)))
    except FleetError as error:
        raise BadFleet(str(error)) from error


def open_cluster(settings: ServeConfig, environ: Mapping[str, str]) -> ClusterAccess | None:
    """The Kubernetes cluster to attribute pods from; None (attribution off) without one."""
    if not cluster_configured(settings.kubeconfig, environ):
        return None
    # Attribution's modules (its HTTP/2 and protobuf for the kubelet, urllib3 for the API
    # server: ~5 MiB) are imported only when there is a cluster.
    from exporter.attribution.access import resolve_cluster  # noqa: PLC0415

    return resolve_cluster(
        kubeconfig=settings.kubeconfig, node_name=settings.node_name, environ=environ
    )


async def _serve(
    settings: ServeConfig,
    driver: NvmlDriver,
    catalog: Catalog,
    cluster: ClusterAccess | None = None,
    security: WebSecurity | None = None,
) -> int:
    security = security or WebSecurity(None, max_requests=settings.max_requests)
    address = settings.listen_address
    try:
        await resolve(address)
    except CannotListen as error:
        return _fail(str(error), error.status)
    app = App(
        settings,
        driver,
        catalog=catalog,
        cluster=cluster,
        fleet=getattr(driver, "fleet", None),
        security=security,
    )
    try:
        await app.start()
    except NvmlUnavailable as error:
        return _fail(str(error), 1)
    # Everything imported and built so far lives as long as the process. Freezing it keeps the
    # cycle collector from re-scanning it several times a cycle (about 2 ms of CPU per cycle on
    # an 8-GPU node).
    gc.collect()
    gc.freeze()
    # While the sampler thread works (a few ms a cycle), a scrape waits for the GIL for up to the
    # switch interval: 1 ms instead of Python's 5 ms keeps the p99 scrape latency low.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    try:
        listener = await listen(app.handle, address, security)
    except CannotListen as error:
        await app.stop()
        return _fail(str(error), error.status)
    log.info(
        "listening",
        extra={
            "address": listener.shown(),
            "telemetry_path": settings.telemetry_path,
            "version": __version__,
            "simulate": settings.simulate or "",
            **security.describe(),
        },
    )

    await serve_until_stopped(
        listener,
        security,
        settings.web_config_file,
        log,
        shutdown_seconds=SHUTDOWN_SECONDS,
        then=app.stop,
    )
    return 0
