"""`gpuscope calibrate` once its flags are checked: measure, then write the profile where asked."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, TextIO

from kubernetes import client

from exporter.calibrate.configmap import ConfigMapError, api_client, check_access, merge_profile
from exporter.calibrate.device import DeviceError, describe, resolve
from exporter.calibrate.progress import reporter_for
from exporter.calibrate.run import run_calibration
from exporter.calibration.parse import parse_profile_text
from exporter.calibration.profile import configmap_key, dump_profile
from exporter.catalog import CatalogError, catalog_from_file
from exporter.logs import configure
from exporter.nvml.driver import system_driver

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.calibrate.options import CalibrateOptions

log = logging.getLogger("exporter.calibrate")


class CommandError(Exception):
    """Calibration cannot go on: one line for the user, and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def run(
    options: CalibrateOptions, *, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr
) -> int:
    configure(options.log_level, options.log_format)
    try:
        catalog = catalog_from_file(options.catalog_file)
    except CatalogError as error:
        raise CommandError(f"invalid --catalog.file: {error}", 2) from error
    api = None
    if options.configmap is not None:
        try:
            api = client.CoreV1Api(api_client(options.kubeconfig))
        except ConfigMapError as error:
            raise CommandError(str(error), 2) from error
        try:
            check_access(api, *options.configmap)
        except ConfigMapError as error:
            raise CommandError(str(error), 1) from error
    try:
        device = resolve(options.device)
    except DeviceError as error:
        raise CommandError(str(error), 1) from error
    info = describe(device)
    log.info(
        "calibrating",
        extra={"device": str(device), "model": info.model, "quick": options.quick},
    )
    with contextlib.closing(reporter_for(stderr)) as reporter:
        profile = run_calibration(
            info,
            quick=options.quick,
            catalog=catalog,
            reporter=reporter,
            nvml=system_driver() if device.type == "cuda" else None,
        )
    text = dump_profile(profile, "json")
    parse_profile_text(text, source="the measured profile", fmt="json")  # never write a bad one
    if options.output_file is not None:
        _write_atomically(options.output_file, dump_profile(profile, options.output_format))
    if options.to_stdout:
        stdout.write(text)
        stdout.flush()
    merged = ""
    if api is not None and options.configmap is not None:
        namespace, name = options.configmap
        key = configmap_key(profile.model)
        try:
            outcome = merge_profile(api, namespace, name, key, text)
        except ConfigMapError as error:
            raise CommandError(str(error), 1) from error
        merged = f"{namespace}/{name}[{key}] {outcome}"
    log.info(
        "calibration finished",
        extra={
            "model": profile.model,
            "device": profile.device,
            "seconds": profile.duration_seconds,
            "output": str(options.output_file or ""),
            "configmap": merged,
        },
    )
    return 0


def _write_atomically(path: Path, text: str) -> None:
    """Write beside the target, then rename: a reader never sees half a profile."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise CommandError(f"cannot write --output {path}: {error.strerror or error}", 1) from error
