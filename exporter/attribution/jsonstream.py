"""JSON read as its bytes arrive, building only the parts a `Shape` names; pure.

What the API server sends is tenants' data. A pod need only name the node to be in its list, and
it may carry up to etcd's 1.5 MiB of env entries, labels or annotations; `json.loads` holds the
answer's bytes and every value in it at once, 10-30 times the bytes in Python objects (35 such
pods took the daemon to 506 MiB). `JsonStream` reads chunk by chunk instead: what the shape does
not name is scanned for its strings and brackets only (never decoded, nor checked beyond that)
and dropped with its chunk; what it names is built, strings cut at `Scalar.max_length` characters
and lists and maps at `Items.max_items` and `Entries.max_entries`. Memory is then a chunk and what
is kept, whatever the size of the document. A small document that has arrived whole on a line of
its own (a watch event of an ordinary pod) is parsed by `json.loads` and pruned to the same
result (`prune`), which is five times faster than reading it byte by byte.

Shapes: `Scalar` keeps a string, number, true, false or null; `Fields` an object's named keys
(other keys are skipped); `Entries` a map's entries whose key passes `keep`; `Items` a list's
items, each through `select` when given (which turns it into what is kept, or None to drop it).
A value of another kind than its shape expects is kept as it is if it is a scalar (strings cut),
and as None if it is an object or a list: the caller's checks then refuse it as they would the
whole document's.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from exporter.documents import size_text

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

CHUNK_BYTES: Final = 64 * 1024
"""How much is asked of the connection at a time."""
MAX_TEXT: Final = 1024
"""A kept string is cut to this many characters by default: every field attribution reads is far
shorter where the API validates it (names 253, label values 63), and an image is shown cut to 128."""
MAX_KEY: Final = 1024
"""A key longer than this is no field of any shape, nor a key any map keeps: it is skipped."""
_MAX_SCALAR: Final = 64
"""A number (or true, false, null) longer than this is not JSON the API server sends."""
WHOLE_LINE_BYTES: Final = 64 * 1024
"""A document that has arrived whole on one line of at most this many bytes (a watch event of an
ordinary pod, a few KiB) is parsed by `json.loads` and then pruned to its shape: five times
faster than reading it byte by byte, and what it holds meanwhile is bounded by this size."""
_RAW_PER_CHARACTER: Final = 12
"""The most bytes one decoded character takes in a JSON string (`\\ud83d\\ude00`, a surrogate pair)."""

_QUOTE: Final = ord('"')
_BACKSLASH: Final = ord("\\")
_COLON: Final = ord(":")
_COMMA: Final = ord(",")
_OPEN_OBJECT: Final = ord("{")
_CLOSE_OBJECT: Final = ord("}")
_OPEN_LIST: Final = ord("[")
_CLOSE_LIST: Final = ord("]")

_WHITESPACE: Final = re.compile(rb"[ \t\r\n]*+")
_STRING_BODY: Final = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)
"""A string's characters up to its closing quote, or up to the end of what has arrived (a lone
backslash at the end waits for the character it escapes)."""
_STRING: Final = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_PLAIN: Final = rb'[^"\[\]{}]++'
_SKIPPABLE: Final = re.compile(
    rb"(?:"
    + _PLAIN
    + rb"|"
    + _STRING
    + rb"|\{(?:"
    + _PLAIN
    + rb"|"
    + _STRING
    + rb")*+\}|\[(?:"
    + _PLAIN
    + rb"|"
    + _STRING
    + rb")*+\])*+",
    re.DOTALL,
)
"""What a skipped value holds between brackets: text, whole strings, and whole objects or lists
without brackets inside (an env entry), matched in one call. Possessive throughout: a match
never backtracks, so text that ends mid-string costs one pass, not exponential time."""
_SCALAR: Final = re.compile(rb'[^ \t\r\n,:\[\]{}"]*+')
_SIMPLE_KEY: Final = re.compile(rb'[ \t\r\n]*+"([^"\\]{0,256}+)"[ \t\r\n]*+:')
"""A key without escapes and the colon after it, all arrived: most keys, read in one call."""
_SEPARATOR: Final = re.compile(rb"[ \t\r\n]*+([,}\]])")


class JsonError(ValueError):
    """Not the JSON expected; `str()` says what was wrong."""


class Incomplete(JsonError):
    """The bytes ended in the middle of a value."""


class TooLarge(JsonError):
    """One value is larger than its limit."""


@dataclass(frozen=True, slots=True)
class Scalar:
    """A string (cut to `max_length` characters), number, true, false or null."""

    max_length: int = MAX_TEXT


@dataclass(frozen=True, slots=True)
class Fields:
    """An object, of which the keys named are kept, each read with its shape."""

    fields: Mapping[str, Shape]

    def merged(self, other: Fields) -> Fields:
        """These fields and `other`'s; where both name an object, their fields merged too."""
        fields = dict(self.fields)
        for key, shape in other.fields.items():
            mine = fields.get(key)
            fields[key] = (
                mine.merged(shape)
                if isinstance(mine, Fields) and isinstance(shape, Fields)
                else shape
            )
        return Fields(fields)


@dataclass(frozen=True, slots=True)
class Entries:
    """A map, of which the entries whose key passes `keep` are kept (the first `max_entries`)."""

    value: Shape
    keep: Callable[[str], bool]
    max_entries: int


@dataclass(frozen=True, slots=True)
class Items:
    """A list, of which the first `max_items` items kept are kept. `select(item, kept so far)`
    turns each item into what is kept, or None to drop it."""

    item: Shape
    max_items: int = sys.maxsize
    select: Callable[[object, Sequence[object]], object | None] | None = field(default=None)


Shape = Scalar | Fields | Entries | Items
TEXT: Final = Scalar()


def nested(path: str, shape: Shape) -> Fields:
    """The objects around `shape` at the dotted `path` (`spec.devices.requests`)."""
    *outer, last = path.split(".")
    found = Fields({last: shape})
    for key in reversed(outer):
        found = Fields({key: found})
    return found


class JsonStream:
    """JSON values read from `chunks` as they arrive: one document (`value`), or a stream of
    them separated by whitespace (`values`, a watch). A value is refused (`TooLarge`) once more
    than `max_value_bytes` of it have been read; `what` names the values in errors."""

    def __init__(self, chunks: Iterable[bytes], *, max_value_bytes: int, what: str) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self._pos = 0
        self._offset = 0
        """Where `_buffer` starts in the stream."""
        self._started: int | None = None
        """Where the value being read started in the stream."""
        self._limit = max_value_bytes
        self._what = what
        self._ended = False

    def value(self, shape: Shape) -> object:
        """The one document the bytes hold."""
        if not self._skip_whitespace():
            raise Incomplete(f"{self._what} is empty")
        found = self._top(shape)
        if self._skip_whitespace():
            raise JsonError(f"{self._what} holds more than one document")
        return found

    def values(self, shape: Shape) -> Iterator[object]:
        """Each document, as soon as it has arrived whole."""
        while self._skip_whitespace():
            yield self._top(shape)

    # -- reading ------------------------------------------------------------------------------

    def _top(self, shape: Shape) -> object:
        line_end = self._buffer.find(b"\n", self._pos, self._pos + WHOLE_LINE_BYTES)
        if 0 <= line_end - self._pos <= self._limit:
            try:
                document = json.loads(self._buffer[self._pos : line_end])
            except (ValueError, RecursionError):
                pass  # not one document on its line: read byte by byte, which says what is wrong
            else:
                self._pos = line_end + 1
                return prune(document, shape)
        started = self._started = self._offset + self._pos
        found = self._value(shape)
        self._started = None
        if self._offset + self._pos - started > self._limit:  # it came in one chunk
            raise TooLarge(f"{self._what} is larger than {size_text(self._limit)}")
        return found

    def _more(self) -> bool:
        """Append the next chunk to what is left unread; False at the end of the bytes. Called
        only once every byte there is has been looked at: a value being read that already spans
        more than its limit is refused here, before more of it is read."""
        if self._started is not None and self._offset + len(self._buffer) - self._started > (
            self._limit
        ):
            raise TooLarge(f"{self._what} is larger than {size_text(self._limit)}")
        if self._ended:
            return False
        chunk = next(self._chunks, None)
        while chunk is not None and not chunk:
            chunk = next(self._chunks, None)
        if chunk is None:
            self._ended = True
            return False
        self._offset += self._pos
        self._buffer = self._buffer[self._pos :] + chunk
        self._pos = 0
        return True

    def _skip_whitespace(self) -> bool:
        """Move to the next byte that is not whitespace; False at the end of the bytes."""
        while True:
            match = _WHITESPACE.match(self._buffer, self._pos)
            assert match is not None  # the pattern matches the empty string
            self._pos = match.end()
            if self._pos < len(self._buffer):
                return True
            if not self._more():
                return False

    def _next(self) -> int:
        """The next byte that is not whitespace, not consumed."""
        if not self._skip_whitespace():
            raise Incomplete(f"{self._what} ends in the middle of a value")
        return self._buffer[self._pos]

    def _expect(self, byte: int) -> None:
        if self._next() != byte:
            raise JsonError(f"{self._what} is not JSON: expected {chr(byte)!r}")
        self._pos += 1

    def _value(self, shape: Shape) -> object:
        first = self._next()
        if first == _QUOTE:
            text, _ = self._string(shape.max_length if isinstance(shape, Scalar) else MAX_TEXT)
            return text
        if first == _OPEN_OBJECT and isinstance(shape, Fields | Entries):
            return self._object(shape)
        if first == _OPEN_LIST and isinstance(shape, Items):
            return self._list(shape)
        if first in (_OPEN_OBJECT, _OPEN_LIST):
            self._skip()
            return None
        return self._scalar()

    def _object(self, shape: Fields | Entries) -> dict[str, object]:
        self._pos += 1
        found: dict[str, object] = {}
        if self._next() == _CLOSE_OBJECT:
            self._pos += 1
            return found
        while True:
            simple = _SIMPLE_KEY.match(self._buffer, self._pos)
            if simple is not None:
                key, whole = _decode(simple[1], whole=True, what=self._what), True
                self._pos = simple.end()
            elif self._next() != _QUOTE:
                raise JsonError(f"{self._what} is not JSON: expected a key")
            else:
                key, whole = self._string(MAX_KEY)
                self._expect(_COLON)
            value_shape: Shape | None = None
            if whole and isinstance(shape, Fields):
                value_shape = shape.fields.get(key)
            elif whole and isinstance(shape, Entries) and shape.keep(key):
                value_shape = (
                    shape.value if key in found or len(found) < shape.max_entries else None
                )
            if value_shape is None:
                self._skip()
            else:
                found[key] = self._value(value_shape)
            if self._separator(_CLOSE_OBJECT):
                return found

    def _list(self, shape: Items) -> list[object]:
        self._pos += 1
        found: list[object] = []
        if self._next() == _CLOSE_LIST:
            self._pos += 1
            return found
        while True:
            if len(found) < shape.max_items:
                item = self._value(shape.item)
                kept = item if shape.select is None else shape.select(item, found)
                if kept is not None:
                    found.append(kept)
            else:
                self._skip()
            if self._separator(_CLOSE_LIST):
                return found

    def _separator(self, closing: int) -> bool:
        """Past a comma (False) or the closing bracket (True)."""
        separator = _SEPARATOR.match(self._buffer, self._pos)
        if separator is not None:
            byte = separator[1][0]
            self._pos = separator.end()
        else:
            byte = self._next()
            self._pos += 1
        if byte == _COMMA:
            return False
        if byte == closing:
            return True
        raise JsonError(f"{self._what} is not JSON: expected ',' or {chr(closing)!r}")

    def _string(self, max_length: int) -> tuple[str, bool]:
        """The string starting here, cut to `max_length` characters; and whether it was whole.
        Only as many bytes as that many characters can take are kept while it is read."""
        self._pos += 1
        room = max_length * _RAW_PER_CHARACTER
        kept = bytearray()
        whole = True
        while True:
            match = _STRING_BODY.match(self._buffer, self._pos)
            assert match is not None  # the pattern matches the empty string
            end = match.end()
            if end - self._pos > room:
                kept += self._buffer[self._pos : self._pos + room]
                room = 0
                whole = False
            else:
                kept += self._buffer[self._pos : end]
                room -= end - self._pos
            self._pos = end
            if end < len(self._buffer) and self._buffer[end] == _QUOTE:
                self._pos = end + 1
                break
            if not self._more():
                raise Incomplete(f"{self._what} ends in the middle of a string")
        text = _decode(bytes(kept), whole=whole, what=self._what)
        if len(text) > max_length:
            return text[:max_length], False
        return text, whole

    def _skip_string(self) -> None:
        self._pos += 1
        while True:
            match = _STRING_BODY.match(self._buffer, self._pos)
            assert match is not None  # the pattern matches the empty string
            self._pos = match.end()
            if self._pos < len(self._buffer) and self._buffer[self._pos] == _QUOTE:
                self._pos += 1
                return
            if not self._more():
                raise Incomplete(f"{self._what} ends in the middle of a string")

    def _scalar(self) -> object:
        while True:
            match = _SCALAR.match(self._buffer, self._pos)
            assert match is not None  # the pattern matches the empty string
            end = match.end()
            if end - self._pos > _MAX_SCALAR:
                raise JsonError(f"{self._what} is not JSON: a value that is not one")
            if end < len(self._buffer) or not self._more():
                break  # else the value may go on in the next chunk: match it again
        token = self._buffer[self._pos : end]
        if not token:
            raise JsonError(f"{self._what} is not JSON: unexpected {chr(self._buffer[end])!r}")
        self._pos = end
        try:
            return json.loads(token)
        except ValueError as error:
            raise JsonError(f"{self._what} is not JSON: a value that is not one") from error

    def _skip(self) -> None:
        """Past the value starting here, building nothing."""
        first = self._next()
        if first == _QUOTE:
            self._skip_string()
            return
        if first not in (_OPEN_OBJECT, _OPEN_LIST):
            self._scalar()
            return
        self._pos += 1
        depth = 1
        while True:
            match = _SKIPPABLE.match(self._buffer, self._pos)
            assert match is not None  # the pattern matches the empty string
            self._pos = match.end()
            if self._pos == len(self._buffer):
                if not self._more():
                    raise Incomplete(f"{self._what} ends in the middle of a value")
                continue
            byte = self._buffer[self._pos]
            if byte == _QUOTE:
                self._skip_string()
                continue
            self._pos += 1
            depth += 1 if byte in (_OPEN_OBJECT, _OPEN_LIST) else -1
            if depth == 0:
                return


def prune(value: object, shape: Shape) -> object:
    """What reading `value`'s bytes with `shape` keeps, from the value a whole parse made."""
    if isinstance(value, str):
        return value[: shape.max_length if isinstance(shape, Scalar) else MAX_TEXT]
    if isinstance(value, dict):
        return _prune_object(value, shape)
    if isinstance(value, list):
        return _prune_list(value, shape) if isinstance(shape, Items) else None
    return value


def _prune_object(value: dict[str, object], shape: Shape) -> dict[str, object] | None:
    if isinstance(shape, Fields):
        return {
            key: prune(item, shape.fields[key])
            for key, item in value.items()
            if key in shape.fields
        }
    if not isinstance(shape, Entries):
        return None
    found: dict[str, object] = {}
    for key, item in value.items():
        if len(key) <= MAX_KEY and len(found) < shape.max_entries and shape.keep(key):
            found[key] = prune(item, shape.value)
    return found


def _prune_list(value: list[object], shape: Items) -> list[object]:
    kept: list[object] = []
    for item in value:
        if len(kept) >= shape.max_items:
            break
        one = prune(item, shape.item)
        one = one if shape.select is None else shape.select(one, kept)
        if one is not None:
            kept.append(one)
    return kept


def _decode(raw: bytes, *, whole: bool, what: str) -> str:
    """A string's characters from its raw bytes (without the quotes). A string cut short may end
    in the middle of an escape or of a UTF-8 sequence: those last bytes are dropped."""
    simple = _BACKSLASH not in raw
    for cut in range(_RAW_PER_CHARACTER + 1) if not whole else (0,):
        piece = raw[: len(raw) - cut]
        try:
            return piece.decode() if simple else str(json.loads(b'"' + piece + b'"'))
        except ValueError:
            continue
    raise JsonError(f"{what} is not JSON: a string that is not UTF-8 or has a bad escape")
