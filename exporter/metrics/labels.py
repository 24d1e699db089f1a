"""Label sets that render once: the `{a="1",b="2"}` text of a series, computed when the set is
made and reused by every render after.

A node's series share few distinct label sets — each GPU's, each pod row's — and they recur in
every family and every cycle; formatting and escaping them anew dominated rendering. Families
therefore take their label sets from caches keyed by what names the series (a GPU's identity, a
pod's identity), and the renderer writes the stored text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

K = TypeVar("K")

CACHE_LIMIT: Final = 8192
"""Label sets kept by each cache; past that a cache starts again, so series that come and go
(processes, pods) never pile up."""


def escape_label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def render_labels(pairs: Iterable[tuple[str, str]]) -> str:
    """`{a="1",b="2"}` with names sorted (as prometheus_client writes them); "" for no labels."""
    inner = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in sorted(pairs))
    return f"{{{inner}}}" if inner else ""


class LabelSet(dict[str, str]):
    """A series' labels with their rendered text. Never changed once made: it is shared by many
    series, across cycles."""

    __slots__ = ("rendered",)

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self.rendered = render_labels(self.items())


class LabelVariants:
    """A base label set and its variants with more pairs (`("clock", "sm")`), each made once."""

    __slots__ = ("_variants", "base")

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.base = LabelSet(pairs)
        self._variants: dict[tuple[tuple[str, str], ...], LabelSet] = {}

    def with_pairs(self, *pairs: tuple[str, str]) -> LabelSet:
        found = self._variants.get(pairs)
        if found is None:
            if len(self._variants) >= CACHE_LIMIT:
                self._variants.clear()
            found = self._variants[pairs] = LabelSet([*self.base.items(), *pairs])
        return found


class LabelCache(Generic[K]):
    """Label variants by what names the series (a GPU's identity, a pod row), bounded."""

    def __init__(self, pairs: Callable[[K], Iterable[tuple[str, str]]]) -> None:
        self._pairs = pairs
        self._variants: dict[K, LabelVariants] = {}

    def __call__(self, key: K) -> LabelVariants:
        found = self._variants.get(key)
        if found is None:
            if len(self._variants) >= CACHE_LIMIT:
                self._variants.clear()
            found = self._variants[key] = LabelVariants(self._pairs(key))
        return found
