"""`gpuscope rightsize`: read history from a PromQL API, recommend, report, notify;
`gpuscope rightsize serve`: the same, again and again, as a server (`server.py`).

Exit status: 0 with a report (whether or not the notifications went out: a failed one is
logged), 1 when the report cannot be made (Prometheus unreachable or refusing, the output or the
ConfigMap not writable), 2 for bad settings (`exporter/rightsize/options.py`, checked before any
query). Each failure is one line on stderr.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import stat
import sys
import tempfile
from typing import TYPE_CHECKING

from exporter import logs
from exporter.rightsize.configmap import ConfigMapError, write_report
from exporter.rightsize.formatters import DIRECTORIES, EXTENSIONS, FORMATTERS, Output
from exporter.rightsize.formatters.patches import MARK
from exporter.rightsize.notify import notify
from exporter.rightsize.options import PROG, RightsizeConfig, load
from exporter.rightsize.produce import produce
from exporter.rightsize.prometheus import PrometheusError
from exporter.settings import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from exporter.rightsize.report import Report

log = logging.getLogger("exporter.rightsize")


def main(argv: Sequence[str]) -> int:
    """Run `gpuscope rightsize` (or `gpuscope rightsize serve`) with these arguments; the exit
    status."""
    if list(argv[:1]) == ["serve"]:
        from exporter.rightsize.server import main as serve  # noqa: PLC0415 - only the server's

        return serve(argv[1:])
    try:
        config = load(argv, os.environ)
    except ConfigError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_format)
    try:
        report = asyncio.run(produce(config))
    except PrometheusError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    status = _write(config, report)
    if status == 0 and config.notify:
        asyncio.run(
            notify(
                report,
                config.notify,
                report_url=config.report_url,
                attempt_seconds=config.notify_timeout,
            )
        )
    return status


def _write(config: RightsizeConfig, report: Report) -> int:
    """The report where the settings say; the exit status."""
    if config.output_format in DIRECTORIES and config.output is not None:
        try:
            written = write_directory(config.output, DIRECTORIES[config.output_format](report))
        except OSError as error:
            print(
                f"{PROG}: error: cannot write {config.output}: {error.strerror or error}",
                file=sys.stderr,
            )
            return 1
        log.info("patches written", extra={"directory": str(config.output), "files": written})
        return 0
    terminal = config.output is None and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else 180
    text = FORMATTERS[config.output_format](report, Output(terminal=terminal, width=width))
    try:
        if config.output is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            write_file(config.output, text)
        if config.configmap is not None:
            key = f"report.{EXTENSIONS[config.output_format]}"
            write_report(config.configmap, key, text, generated_at=report.end)
            log.info("configmap written", extra={"configmap": str(config.configmap), "key": key})
    except OSError as error:
        print(
            f"{PROG}: error: cannot write {config.output}: {error.strerror or error}",
            file=sys.stderr,
        )
        return 1
    except ConfigMapError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    return 0


def write_file(path: Path, text: str) -> None:
    """`text` as the regular file at `path`. Opened without blocking and checked before any
    write: a FIFO made there since the start would otherwise hold the job until a reader came
    (with none, opening fails at once: ENXIO)."""
    descriptor = os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644
    )
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        file.truncate()
        file.write(text)


def write_directory(directory: Path, files: dict[str, str]) -> int:
    """Write `files` into `directory` (made if need be), its scripts executable; patch files of an
    earlier run that this one no longer has are removed, so the directory holds this report's
    changes only. The number of files written."""
    directory.mkdir(exist_ok=True)
    for stale in directory.glob("*.yaml"):
        if stale.name not in files and _is_patch(stale):
            stale.unlink()
    for name, text in files.items():
        # Written aside and renamed over the name: whatever was there (a FIFO that would block
        # a write, a symlink that would carry it elsewhere) is replaced, never written through.
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=directory, prefix=".gpuscope-", delete=False
        ) as file:
            file.write(text)
        os.chmod(file.name, 0o755 if name.endswith(".sh") else 0o644)
        os.replace(file.name, directory / name)
    return len(files)


def _is_patch(path: Path) -> bool:
    """Whether `path` is a regular file starting with the patches' mark. Opened without
    blocking and checked before any read, as `documents.read_bounded` does: a FIFO someone left
    in the directory would block the job until a writer came."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return False
        try:
            return file.read(len(MARK)) == MARK.encode()
        except OSError:
            return False
