"""Credentials a kubeconfig's user gets by running something: an `exec` plugin (client-go's
credential plugin protocol, `client.authentication.k8s.io/v1` and `v1beta1`, run here), or an
`auth-provider` (gcp, oidc, azure: the `kubernetes` package's loader gets its token).

Both are got by the first request that needs them, in the thread making it (a watch, the
kubelet poller's claim reads), never at start: the listener serves `/metrics` from the start
whatever credentials cost, and a plugin that hangs costs pod attribution only. Every attempt is
bounded by `TIMEOUT_SECONDS`: an exec plugin is killed then, with whatever it started (it runs in
a session of its own), and its answer is read up to `MAX_ANSWER_BYTES`; an auth-provider's call,
which cannot be killed, is left to finish in a daemon thread of its own while the requests give
up. A failure is logged once, in one line naming the plugin's command or the provider, and is
the answer to every thread for `RETRY_SECONDS` before anything runs again. An exec plugin's
credentials are kept until their `expirationTimestamp` (less `EXPIRY_MARGIN_SECONDS`) or until
the API server refuses them (401), as client-go keeps them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from exporter import documents
from exporter.attribution.cluster import CredentialError
from exporter.logs import LogOnce

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Mapping

    from kubernetes.client import Configuration

log = logging.getLogger(__name__)

TIMEOUT_SECONDS: Final = 30.0
"""How long an exec plugin or auth-provider may take. client-go waits for ever; the plugins in
use (aws eks get-token, gke-gcloud-auth-plugin, kubelogin non-interactive) answer in a second or
two, from a cache or one call to their cloud's token service, and 30 s lets that call ride out a
slow network. Past it the plugin is killed and the failure logged: someone looking sees it while
they look, and the daemon has served /metrics throughout."""
RETRY_SECONDS: Final = 10.0
"""After a failure, every request is refused with it for this long before the plugin runs again."""
EXPIRY_MARGIN_SECONDS: Final = 60.0
"""Credentials are made again this long before their expirationTimestamp."""
MAX_ANSWER_BYTES: Final = 1024 * 1024
"""An ExecCredential is a token or a certificate and its key: a few KiB."""
MAX_STDERR_BYTES: Final = 4096
"""The end of what a failing plugin wrote to stderr is kept for its error line."""
API_VERSIONS: Final = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
"""The exec plugin protocol's versions Kubernetes serves (v1alpha1 was removed in 1.24)."""
_ERROR_TEXT: Final = 200

_running: set[subprocess.Popen[bytes]] = set()
"""Exec plugins running now, whichever thread runs them: killed if the daemon exits first, so
that a plugin never outlives it. Locked."""
_running_lock = threading.Lock()


@atexit.register
def _kill_running() -> None:
    with _running_lock:
        running = list(_running)
    for process in running:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """A kubeconfig user's `exec` section, checked."""

    command: str
    """As the kubeconfig names it: a program on PATH, or a path (relative ones already resolved
    against the kubeconfig's directory, as client-go does)."""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = API_VERSIONS[0]
    cluster: Mapping[str, object] | None = None
    """`spec.cluster` of the request, when the kubeconfig sets `provideClusterInfo`."""

    @property
    def name(self) -> str:
        """How log lines name the plugin: its command, quoted (never its arguments, which may
        carry secrets)."""
        return documents.quote(self.command, 120)


@dataclass(frozen=True, slots=True)
class _Credentials:
    header: str | None
    tls: ssl.SSLContext | None
    expires_at: float | None
    """On the monotonic clock; None for credentials without an expiry."""


class ExecPlugin:
    """A kubeconfig user's exec plugin, run when credentials are due. Shared by every thread
    that makes requests: locked (one run at a time; the others wait for its answer)."""

    def __init__(
        self,
        spec: ExecSpec,
        *,
        tls: ssl.SSLContext | None,
        with_certificate: Callable[[str, str], ssl.SSLContext] | None,
        timeout: float = TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self._tls = tls
        """The cluster's TLS context, for credentials without a client certificate."""
        self._with_certificate = with_certificate
        """The cluster's TLS context with a client certificate (PEM text and key) added; None
        for a plain-HTTP server."""
        self._timeout = timeout
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._credentials: _Credentials | None = None
        self._failed: tuple[float, str] | None = None
        """(until when, why) after a failed run."""
        self._once = LogOnce(log)

    # -- what requests ask (ApiConfig's authorization, client_tls and rejected) ---------------

    def authorization(self) -> str | None:
        return self._current().header

    def client_tls(self) -> ssl.SSLContext | None:
        return self._current().tls or self._tls

    def rejected(self) -> None:
        """The API server refused the credentials: make them again for the next request."""
        with self._lock:
            self._credentials = None

    # -- running the plugin -------------------------------------------------------------------

    def _current(self) -> _Credentials:
        with self._lock:
            now = self._clock()
            known = self._credentials
            if known is not None and (known.expires_at is None or now < known.expires_at):
                return known
            if self._failed is not None and now < self._failed[0]:
                raise CredentialError(self._failed[1])
            try:
                credentials = self._run()
            except CredentialError as error:
                self._credentials = None
                self._failed = (self._clock() + RETRY_SECONDS, str(error))
                self._once(
                    logging.ERROR,
                    ("exec", _kind(str(error))),
                    f"{error}: no credentials for the Kubernetes API, so pods are not attributed; "
                    f"running it again every {RETRY_SECONDS:g}s",
                    fields={"command": self.spec.command},
                )
                raise
            if self._failed is not None:
                log.info(
                    "the kubeconfig's exec plugin answers again",
                    extra={"command": self.spec.command},
                )
                self._once.forget_matching(("exec",))
            self._failed = None
            self._credentials = credentials
            return credentials

    def _run(self) -> _Credentials:
        name = f"the kubeconfig's exec plugin {self.spec.name}"
        request: dict[str, object] = {"interactive": False}
        if self.spec.cluster is not None:
            request["cluster"] = dict(self.spec.cluster)
        info = {"apiVersion": self.spec.api_version, "kind": "ExecCredential", "spec": request}
        environment = {
            **os.environ,
            **dict(self.spec.env),
            "KUBERNETES_EXEC_INFO": json.dumps(info),
        }
        try:
            process = subprocess.Popen(  # noqa: S603 - the command the kubeconfig names
                [self.spec.command, *self.spec.args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=environment,
                start_new_session=True,  # so that a timeout kills whatever it started too
            )
        except OSError as error:
            raise CredentialError(f"{name} could not be started: {_problem(error)}") from error
        with _running_lock:
            _running.add(process)
        try:
            answer, stderr = _communicate(process, self._clock() + self._timeout, self._clock)
        except TimeoutError as error:
            raise CredentialError(f"{name} did not answer within {self._timeout:g}s") from error
        except _TooLong as error:
            raise CredentialError(
                f"{name} answered more than {documents.size_text(MAX_ANSWER_BYTES)}"
            ) from error
        finally:
            _end(process)
            with _running_lock:
                _running.discard(process)
        if process.returncode != 0:
            said = _last_line(stderr)
            raise CredentialError(
                f"{name} failed with exit status {process.returncode}"
                + (f": {said}" if said else "")
            )
        try:
            return self._credentials_from(answer)
        except documents.Invalid as problem:
            where = f" {problem.path}:" if problem.path else ""
            raise CredentialError(
                f"{name} answered no ExecCredential:{where} {problem.problem}"
            ) from None

    def _credentials_from(self, answer: bytes) -> _Credentials:
        try:
            document = json.loads(answer)
        except ValueError:
            raise documents.Invalid("", "not JSON") from None
        credential = documents.mapping(document, "")
        for key, wanted in (("apiVersion", self.spec.api_version), ("kind", "ExecCredential")):
            found = credential.get(key)
            if found != wanted:
                raise documents.Invalid(key, f"{documents.quote(found)}, not {wanted!r}")
        status = documents.mapping(credential.get("status"), "status")
        token = status.get("token")
        certificate = status.get("clientCertificateData")
        private_key = status.get("clientKeyData")
        expires_at = None
        if status.get("expirationTimestamp") is not None:
            expires_at = self._expiry(status["expirationTimestamp"])
        if isinstance(token, str) and token:
            return _Credentials(f"Bearer {token}", None, expires_at)
        if (
            isinstance(certificate, str)
            and isinstance(private_key, str)
            and certificate
            and private_key
        ):
            if self._with_certificate is None:
                raise documents.Invalid("status", "a client certificate for a plain-HTTP server")
            try:
                tls = self._with_certificate(certificate, private_key)
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                raise documents.Invalid("status.clientCertificateData", _problem(error)) from None
            return _Credentials(None, tls, expires_at)
        raise documents.Invalid(
            "status", "neither a token nor clientCertificateData and clientKeyData"
        )

    def _expiry(self, value: object) -> float:
        text = documents.text(value, "status.expirationTimestamp")
        try:
            expires = datetime.fromisoformat(text)
        except ValueError:
            raise documents.Invalid(
                "status.expirationTimestamp", f"{documents.quote(text)} is not an RFC 3339 time"
            ) from None
        if expires.tzinfo is None:
            raise documents.Invalid("status.expirationTimestamp", "has no time zone")
        left = expires.timestamp() - self._wall_clock()
        return self._clock() + left - EXPIRY_MARGIN_SECONDS


class _TooLong(Exception):
    """A plugin wrote more than `MAX_ANSWER_BYTES`."""


def _communicate(
    process: subprocess.Popen[bytes], deadline: float, clock: Callable[[], float]
) -> tuple[bytes, bytes]:
    """(stdout, the end of stderr) of `process` once it has ended; TimeoutError past
    `deadline`, `_TooLong` past `MAX_ANSWER_BYTES` of stdout."""
    assert process.stdout is not None
    assert process.stderr is not None
    answer, stderr = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, answer)
        selector.register(process.stderr, selectors.EVENT_READ, stderr)
        while selector.get_map():
            left = deadline - clock()
            if left <= 0:
                raise TimeoutError
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                kept: bytearray = key.data
                kept += data
                if len(answer) > MAX_ANSWER_BYTES:
                    raise _TooLong
                if len(stderr) > MAX_STDERR_BYTES:
                    del stderr[: len(stderr) - MAX_STDERR_BYTES]
    try:
        process.wait(max(deadline - clock(), 0.001))
    except subprocess.TimeoutExpired as error:  # it closed its output but goes on
        raise TimeoutError from error
    return bytes(answer), bytes(stderr)


def _end(process: subprocess.Popen[bytes]) -> None:
    """Kill the plugin and what it started if it still runs; reap it; close its pipes."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _kind(problem: str) -> str:
    """What a failure is, without its details (a plugin's stderr may differ every run): what
    is said once, until the credentials come back."""
    return problem.partition(": ")[0]


def _last_line(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:_ERROR_TEXT] if lines else ""


def _problem(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)[:_ERROR_TEXT] or type(error).__name__


class AuthProvider:
    """A kubeconfig user's `auth-provider`: the `kubernetes` package's loader reads the
    kubeconfig and makes (and refreshes) the token; imported on the first request only. Its calls
    may run a command (gcp's `cmd-path`) or go to the network (oidc's refresh) with no time
    limit of their own, so each runs in a daemon thread that a request waits for at most
    `TIMEOUT_SECONDS`; while one has not returned, later requests wait on it rather than start
    another. Shared by every requesting thread: locked."""

    def __init__(self, paths: str, provider: str, *, timeout: float = TIMEOUT_SECONDS) -> None:
        self._paths = paths
        self.provider = provider
        self._timeout = timeout
        self._lock = threading.Lock()
        self._configuration: Configuration | None = None
        self._call: Future[str | None] | None = None
        self._failed: tuple[float, str] | None = None
        self._once = LogOnce(log)

    def __call__(self) -> str | None:
        """The Authorization header of the next request."""
        name = f"the kubeconfig's auth-provider {documents.quote(self.provider)}"
        with self._lock:
            if self._failed is not None and time.monotonic() < self._failed[0]:
                raise CredentialError(self._failed[1])
            if self._call is None or self._call.done():
                self._call = Future()
                threading.Thread(
                    target=self._token,
                    args=(self._call,),
                    name="gpuscope-auth-provider",
                    daemon=True,
                ).start()
            call = self._call
        try:
            header = call.result(self._timeout)
        except TimeoutError:
            problem = f"{name} did not answer within {self._timeout:g}s"
        except Exception as error:  # noqa: BLE001 - whatever the loader raised, it is one line
            problem = f"{name} failed: {_problem(error)}"
        else:
            with self._lock:
                if self._failed is not None:
                    log.info(
                        "the kubeconfig's auth-provider answers again",
                        extra={"provider": self.provider},
                    )
                    self._once.forget_matching(("auth-provider",))
                self._failed = None
            return header
        with self._lock:
            self._failed = (time.monotonic() + RETRY_SECONDS, problem)
        self._once(
            logging.ERROR,
            ("auth-provider", _kind(problem)),
            f"{problem}: no credentials for the Kubernetes API, so pods are not attributed; "
            f"asking it again every {RETRY_SECONDS:g}s",
            fields={"provider": self.provider},
        )
        raise CredentialError(problem)

    def _token(self, call: Future[str | None]) -> None:
        """In a thread of its own: load the configuration once, then ask for the token (which
        the loader refreshes when it has expired)."""
        try:
            if self._configuration is None:
                from kubernetes.client import Configuration  # noqa: PLC0415 - costs ~16 MiB
                from kubernetes.config.kube_config import load_kube_config  # noqa: PLC0415

                configuration = Configuration()
                # persist_config=False: never write refreshed credentials into the user's file.
                load_kube_config(
                    config_file=self._paths,
                    client_configuration=configuration,
                    persist_config=False,
                )
                self._configuration = configuration
            header: str | None = self._configuration.get_api_key_with_prefix("BearerToken")
        except BaseException as error:  # noqa: BLE001 - handed to the request waiting for it
            call.set_exception(error)
            return
        call.set_result(header)
