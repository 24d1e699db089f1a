"""NVIDIA's XID catalog, as data: each XID's text, which dcgm-exporter puts in its XID series'
`err_msg` label.

The texts are `xids.yaml`, shipped in the package: `XID: text` from XID 0 on, in order, without a
gap — a line dropped or numbered twice while copying NVIDIA's table is refused where it is, not
served as the next XID's text. The file is read and checked once, when `--compat.dcgm` first
needs it (`exporter.documents`: bounded, strict, one-line errors).
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from exporter import documents
from exporter.documents import Invalid

CATALOG: Final = "xids.yaml"
UNKNOWN: Final = "Unknown Error"
"""The text of an XID the catalog does not list, as dcgm-exporter labels it."""
MAX_XID: Final = 10_000
MAX_TEXT: Final = 200


class XidCatalogError(ValueError):
    """The XID catalog cannot be used (one line: the file, the XID, what is wrong)."""


def parse_catalog(document: object) -> tuple[str, ...]:
    """XID n's text at position n, from the mapping `XID: text`; `Invalid` where it is not one."""
    if not isinstance(document, dict):
        raise Invalid("", f"expected a mapping of XID to text, got {documents.kind(document)}")
    if not document:
        raise Invalid("", "lists no XID")
    texts: list[str] = []
    for expected, (xid, text) in enumerate(document.items()):
        path = f"XID {documents.quote(xid)}"
        number = documents.integer(xid, path, low=0, high=MAX_XID)
        if number != expected:
            raise Invalid(path, f"expected XID {expected} here (XIDs run from 0, in order)")
        texts.append(documents.text(text, path, max_length=MAX_TEXT))
    return tuple(texts)


def load_catalog(data: bytes, *, source: str = CATALOG) -> tuple[str, ...]:
    """A catalog's texts from its bytes; `XidCatalogError` with one line if it cannot be used."""
    return documents.load_text(data, parse_catalog, XidCatalogError, source=source)


TEXTS: Final = load_catalog(resources.files(__package__).joinpath(CATALOG).read_bytes())


def xid_message(xid: int) -> str:
    """dcgm-exporter's `err_msg` for an XID."""
    return TEXTS[xid] if 0 <= xid < len(TEXTS) else UNKNOWN
