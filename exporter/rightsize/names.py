"""Kubernetes names from Prometheus labels, checked before they reach a patch, a command, a file
name or a comment; and label text made fit for one comment line.

Every name the report knows comes from a label of a series, and a label can be forged (a
PodMonitor with `honorLabels`, remote write): a workload called `--server=http://attacker:8080`
would be an option of the `kubectl` line that patches it, and a bidirectional override would make
a comment read other than it runs. A name Kubernetes itself would refuse cannot be a real
object's, so a workload with one gets no patch and no command (`name_problem` says why), and every
text put in a comment goes through `comment_text`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING, Final

from exporter.documents import quote

if TYPE_CHECKING:
    from collections.abc import Iterable

_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
"""One RFC 1123 label: at most 63 characters, in a subdomain too."""
DNS_LABEL: Final = re.compile(_LABEL)
"""RFC 1123 label, as Kubernetes checks a namespace or a container name (at most 63)."""
DNS_SUBDOMAIN: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
"""RFC 1123 subdomain, as Kubernetes checks most objects' names (at most 253)."""
LABEL_MAX: Final = 63
SUBDOMAIN_MAX: Final = 253
NAME_LIMITS: Final = {"CronJob": 52, "Job": 63}
"""Kinds whose names Kubernetes keeps shorter than a subdomain's 253: a CronJob's (its Jobs add
an 11-character suffix), a Job's (it becomes its pods' `job-name` label value)."""
KIND: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
RESOURCE: Final = re.compile(
    rf"(?:{_LABEL}(?:\.{_LABEL})*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
"""An extended resource's qualified name (`nvidia.com/mig-1g.10gb`)."""
CONTEXT_MAX: Final = 253
NAME_QUOTE_LIMIT: Final = 60
_MARKS: Final = re.compile("\0+")
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
"""Control and format characters (bidirectional overrides U+202A-U+202E and isolates
U+2066-U+2069 among them), separators that end a line, surrogates, private and unassigned code
points: none belongs in a comment line."""


def name_problem(
    *,
    cluster: str,
    namespace: str,
    kind: str,
    name: str,
    containers: Iterable[str] = (),
    resources: Iterable[str] = (),
) -> str | None:
    """Why these names cannot be a Kubernetes object's (the first thing wrong), or None."""
    limit = NAME_LIMITS.get(kind, SUBDOMAIN_MAX)
    checks = [
        (
            "cluster",
            cluster,
            not cluster or _context(cluster),
            "a kubeconfig context name kubectl can be given",
        ),
        (
            "namespace",
            namespace,
            _fits(namespace, DNS_LABEL, LABEL_MAX),
            "a Kubernetes namespace name (an RFC 1123 label)",
        ),
        ("kind", kind, bool(KIND.fullmatch(kind)), "a Kubernetes kind"),
        (
            f"{kind} name",
            name,
            _fits(name, DNS_SUBDOMAIN, limit),
            f"a Kubernetes name (an RFC 1123 subdomain of at most {limit})",
        ),
        *(
            ("container", container, _fits(container, DNS_LABEL, LABEL_MAX), "a container name")
            for container in containers
            if container
        ),
        *(
            ("resource", resource, _fits(resource, RESOURCE, SUBDOMAIN_MAX), "a resource name")
            for resource in resources
            if resource
        ),
    ]
    return next(
        (
            f"{what} {quote(comment_text(value), NAME_QUOTE_LIMIT)} is not {rule}"
            for what, value, ok, rule in checks
            if not ok
        ),
        None,
    )


def _fits(value: str, pattern: re.Pattern[str], limit: int) -> bool:
    return len(value) <= limit and pattern.fullmatch(value) is not None


def _context(cluster: str) -> bool:
    """A context name kubectl takes as `--context=NAME`: free text in a kubeconfig
    (`arn:aws:eks:...:cluster/prod`), but printable, without spaces, not an option."""
    return (
        len(cluster) <= CONTEXT_MAX
        and not cluster.startswith("-")
        and cluster.isprintable()
        and not any(char.isspace() for char in cluster)
    )


def comment_text(text: str) -> str:
    """Text fit for one comment line: control and format characters (newlines, bidirectional
    overrides and isolates, zero-width joiners), line separators and surrogates as single
    spaces, the ends trimmed."""
    marked = "".join(
        "\0" if unicodedata.category(char) in _UNSAFE_CATEGORIES else char for char in text
    )
    return _MARKS.sub(" ", marked).strip()
