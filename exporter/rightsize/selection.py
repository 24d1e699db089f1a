"""Which workloads to look at: namespaces and a Kubernetes label selector, turned into PromQL.

The label selector (`app=trainer,tier in (batch,research),!canary`) is matched against the pod
labels the daemon exports on `gpu_pod_info` as `label_<name>` (only those allowed by its
`--kubernetes.pod-labels`); names are sanitised the way kube-state-metrics does it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_LABEL_NAME: Final = re.compile(
    r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_VALUE: Final = re.compile(r"(|[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class SelectionError(ValueError):
    """A namespace or selector that cannot be used; the message says which part and why."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a label selector."""

    key: str
    operator: str
    """`=`, `!=`, `in`, `notin`, `exists`, `!exists`."""
    values: tuple[str, ...] = ()

    def matcher(self) -> str:
        """The PromQL label matcher on `gpu_pod_info` that this term means."""
        label = prometheus_label_name(self.key)
        if self.operator == "=":
            return f'{label}="{self.values[0]}"'
        if self.operator == "!=":
            return f'{label}!="{self.values[0]}"'
        if self.operator == "exists":
            return f'{label}!=""'
        if self.operator == "!exists":
            return f'{label}=""'
        alternatives = "|".join(re.escape(value) for value in self.values)
        return f'{label}{"=~" if self.operator == "in" else "!~"}"{promql_string(alternatives)}"'


@dataclass(frozen=True, slots=True)
class Selection:
    namespaces: tuple[str, ...] = ()
    """Empty means every namespace."""
    requirements: tuple[Requirement, ...] = ()

    def matchers(self) -> str:
        """Label matchers for the namespaced series (no braces), e.g. `namespace=~"a|b"`."""
        if not self.namespaces:
            return ""
        return f'namespace=~"{"|".join(self.namespaces)}"'

    def pod_filter(self, window: str, *, cluster_label: str | None = None) -> str:
        """A suffix that keeps only pods the label selector matches (or "" without a selector).

        Pods match if their `gpu_pod_info` matched at any time in the window, so pods that ended
        before the report still count. With a cluster label, pods are told apart per cluster.
        """
        if not self.requirements:
            return ""
        matchers = ", ".join(
            [m for m in (self.matchers(),) if m] + [r.matcher() for r in self.requirements]
        )
        pod = f"{cluster_label}, namespace, pod" if cluster_label else "namespace, pod"
        return (
            f" and on ({pod}) group by ({pod}) "
            f"(last_over_time(gpu_pod_info{{{matchers}}}[{window}]))"
        )


def prometheus_label_name(key: str) -> str:
    """`app.kubernetes.io/name` -> `label_app_kubernetes_io_name`, as kube-state-metrics does."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


_ESCAPES: Final = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def promql_string(text: str) -> str:
    """`text` escaped for a double-quoted PromQL string, as PromQL reads one (Go's rules): a
    backslash and a double quote escaped, and every character that is not printable (a newline,
    a line separator, a bidirectional override) as `\\n` or `\\uXXXX`, so that no label value
    can end the string or the line."""
    return "".join(
        _ESCAPES.get(char) or (char if char.isprintable() else _code_point(char)) for char in text
    )


def _code_point(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def parse_namespaces(values: list[str]) -> tuple[str, ...]:
    """Namespaces from repeated or comma-separated `--namespace` values."""
    names: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if len(name) > 63 or not _NAMESPACE.fullmatch(name):
                raise SelectionError(f"{name!r} is not a Kubernetes namespace name")
            if name not in names:
                names.append(name)
    return tuple(names)


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A Kubernetes label selector: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`."""
    return tuple(_parse_term(term) for term in _split_terms(text))


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectionError(f"selector {text!r}: unbalanced parentheses")
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectionError(f"selector {text!r}: unbalanced parentheses")
    terms.append("".join(current).strip())
    if any(not term for term in terms):
        raise SelectionError(f"selector {text!r}: empty term")
    return terms


def _parse_term(term: str) -> Requirement:
    set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s*\((.*)\)", term)
    if set_match:
        key, operator, listed = set_match.groups()
        values = tuple(value.strip() for value in listed.split(","))
        for value in values:
            _check_value(term, value)
        return Requirement(_check_key(term, key), operator, values)
    if term.startswith("!"):
        return Requirement(_check_key(term, term[1:].strip()), "!exists")
    equality = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term)
    if equality:
        key, operator, value = equality.groups()
        _check_value(term, value)
        return Requirement(_check_key(term, key), "!=" if operator == "!=" else "=", (value,))
    return Requirement(_check_key(term, term), "exists")


def _check_key(term: str, key: str) -> str:
    if not _LABEL_NAME.fullmatch(key):
        raise SelectionError(f"selector term {term!r}: {key!r} is not a label name")
    return key


def _check_value(term: str, value: str) -> None:
    if len(value) > 63 or not _VALUE.fullmatch(value):
        raise SelectionError(f"selector term {term!r}: {value!r} is not a label value")
