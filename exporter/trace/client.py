"""`gpuscope trace`: ask a daemon for a GPU trace and save it to a file that Perfetto
(ui.perfetto.dev) opens. A bad flag exits 2; a daemon that cannot be reached, or that refuses
(400, 404 when `--web.enable-trace` is off, 409 while the GPU is traced already), exits 1 with
one line saying why.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlencode, urlsplit

from exporter.trace.endpoint import MAX_SECONDS, PATH

if TYPE_CHECKING:
    from exporter.settings import CommandParser

DEFAULT_URL: Final = "http://localhost:9455"
CONNECT_SECONDS: Final = 10.0
ANSWER_SECONDS: Final = 30.0
"""How long past the trace's own seconds the answer may take (the daemon's last polls, encoding,
the transfer)."""
MAX_ANSWER_BYTES: Final = 256 * 1024 * 1024


class TraceFailed(Exception):
    """Why no trace was saved (one line)."""


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "url",
        nargs="?",
        default=DEFAULT_URL,
        metavar="URL",
        help=f"the daemon: its address, or the trace endpoint's URL (default: {DEFAULT_URL})",
    )
    parser.add_argument(
        "--seconds",
        type=_seconds,
        default=5,
        metavar="N",
        help=f"how long to trace, 1 to {MAX_SECONDS} (default: 5)",
    )
    parser.add_argument(
        "--gpu", metavar="INDEX|UUID", help="trace this GPU only (default: every GPU)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("gpu-trace.json"),
        metavar="FILE",
        help="where to save the trace (default: gpu-trace.json)",
    )
    parser.add_argument(
        "--ca-file", type=Path, metavar="FILE", help="CA certificates to verify an https daemon"
    )
    parser.add_argument(
        "--bearer-token-file", type=Path, metavar="FILE", help="send the token in this file"
    )
    parser.add_argument("--username", help="basic auth user (with --password-file)")
    parser.add_argument("--password-file", type=Path, metavar="FILE", help="basic auth password")


def _seconds(value: str) -> int:
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"an integer from 1 to {MAX_SECONDS}, not {value!r}")
    return int(value)


def run(args: argparse.Namespace) -> int:
    try:
        url = trace_url(args.url, args.seconds, args.gpu)
        headers = _credentials(args)
        body = fetch(url, headers, ca_file=args.ca_file, seconds=args.seconds)
        gpus = _check(body)
        _save(args.output, body)
    except TraceFailed as failure:
        print(f"gpuscope trace: error: {failure}", file=sys.stderr)
        return 1
    print(f"{args.output}: {gpus} GPU(s), {args.seconds} s; open it in https://ui.perfetto.dev")
    return 0


def trace_url(base: str, seconds: int, gpu: str | None) -> str:
    """The endpoint's URL: `base` is a daemon's address (`host:port` or a URL), or the
    endpoint's own URL."""
    if "://" not in base:
        base = f"http://{base}"
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TraceFailed(f"{base!r} is not an http(s) URL")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise TraceFailed(f"{base!r}: give the daemon's address without a query or credentials")
    path = parts.path.rstrip("/")
    if not path.endswith(PATH):
        path += PATH
    query = {"seconds": str(seconds), **({"gpu": gpu} if gpu is not None else {})}
    return f"{parts.scheme}://{parts.netloc}{path}?{urlencode(query)}"


def _credentials(args: argparse.Namespace) -> dict[str, str]:
    if args.bearer_token_file is not None and args.username is not None:
        raise TraceFailed("--bearer-token-file or --username, not both")
    if (args.username is None) != (args.password_file is None):
        raise TraceFailed("--username and --password-file go together")
    if args.bearer_token_file is not None:
        return {"Authorization": f"Bearer {_secret(args.bearer_token_file)}"}
    if args.username is not None:
        basic = f"{args.username}:{_secret(args.password_file)}".encode()
        return {"Authorization": "Basic " + base64.b64encode(basic).decode()}
    return {}


def _secret(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceFailed(f"cannot read {path}: {error}") from None


def fetch(url: str, headers: dict[str, str], *, ca_file: Path | None, seconds: int) -> bytes:
    """The daemon's answer, or `TraceFailed` with the reason."""
    if ca_file is not None and not ca_file.is_file():
        raise TraceFailed(f"--ca-file {ca_file}: not a readable file")
    # Imported here: the whole of urllib3 brings importlib.metadata (and csv, zipfile), which
    # `gpuscope serve`, whose command line this module's flags are part of, never loads.
    import urllib3  # noqa: PLC0415

    pool = urllib3.PoolManager(
        ca_certs=str(ca_file) if ca_file is not None else None,
        timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=seconds + ANSWER_SECONDS),
        retries=False,
    )
    try:
        answer = pool.request("GET", url, headers=headers, preload_content=False)
        try:
            body = answer.read(MAX_ANSWER_BYTES + 1)
        finally:
            answer.release_conn()
    except urllib3.exceptions.HTTPError as error:
        raise TraceFailed(f"cannot reach {url}: {error}") from None
    if answer.status != 200:
        reason = body.decode("utf-8", "replace").strip().splitlines()
        hint = " (is the daemon run with --web.enable-trace?)" if answer.status == 404 else ""
        raise TraceFailed(
            f"{url} answered {answer.status}: {reason[0][:200] if reason else ''}{hint}"
        )
    if len(body) > MAX_ANSWER_BYTES:
        raise TraceFailed(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
    return body


def _check(body: bytes) -> int:
    """The GPUs in the trace; `TraceFailed` when the answer is not one."""
    try:
        events = json.loads(body)["traceEvents"]
    except (ValueError, KeyError, TypeError):
        raise TraceFailed("the answer is not a trace (no traceEvents)") from None
    return sum(1 for event in events if event.get("name") == "process_name")


def _save(output: Path, body: bytes) -> None:
    """Written whole or not at all."""
    directory = output.parent if str(output.parent) else Path()
    umask = os.umask(0)
    os.umask(umask)
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".gpu-trace-", delete=False) as out:
            out.write(body)
        # A temporary file is the owner's alone; the trace gets a plain file's mode.
        os.chmod(out.name, 0o666 & ~umask)
        os.replace(out.name, output)
    except OSError as error:
        raise TraceFailed(f"cannot write {output}: {error}") from None
