"""Reading the documents gpuscope is given, and checking them, one way for every file.

Every YAML or JSON document the project reads — `gpuscope serve --config.file`, the web config,
fleet files, GPU catalogs, calibration profiles, rightsizing price files and settings — comes in
through `load_file` or `load_text`, and so gets the same guarantees:

- **Bounded.** At most `limit` bytes are read (a file past it, or `/dev/urandom`, is refused
  after reading `limit + 1` bytes), and the parsed document may expand to at most `MAX_NODES`
  nodes and `MAX_DEPTH` levels: an alias bomb (`b: [*a, *a, …]` nine levels deep) is refused
  before anyone walks it, and so is an alias that contains itself.
- **Strict.** Text must be UTF-8; a key given twice in one mapping is an error (PyYAML and
  `json` would silently keep the last); YAML is read with the safe loader only.
- **One line.** Anything wrong raises the caller's error class with one line: the source, the
  key path (`gpus[2].memory`) and what was wrong. Values quoted in messages are cut to
  `QUOTE_LIMIT` characters (`quote`); documents holding secrets (`secret=True`) never have their
  text quoted, not even PyYAML's description of a syntax error.

The checks below (`mapping`, `text`, `number`, …) take a value and the key path it was found at,
return the typed value, or raise `Invalid`; `load_*` turns `Invalid` into the caller's error.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import yaml

if TYPE_CHECKING:
    from pathlib import Path

MAX_DOCUMENT_BYTES: Final = 1024 * 1024
"""The default size limit: every settings, catalog, fleet or profile file is far smaller."""
MAX_NODES: Final = 100_000
"""Scalars, lists and mappings a document may expand to, counting each alias at every use."""
MAX_DEPTH: Final = 64
QUOTE_LIMIT: Final = 60
MAX_MESSAGE: Final = 400
"""An error message is cut to this many characters, whatever it quotes."""

Format = Literal["yaml", "json"]
T = TypeVar("T")
E = TypeVar("E", bound=Exception)

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Invalid(Exception):
    """A value that does not fit, at `path` (`gpus[2].memory`; empty for the document itself)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.path else self.problem


def one_line(message: str) -> str:
    """`message` as one line of at most `MAX_MESSAGE` characters."""
    flat = " ".join(message.split())
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 1] + "…"


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for an error message, cut to about `limit` characters."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


_KINDS: Final = (
    (bool, "true/false"),
    (int | float, "a number"),
    (str, "a string"),
    (Mapping, "a mapping"),
    (list | tuple, "a list"),
)


def kind(value: object) -> str:
    """What a value is, in a document's words."""
    if value is None:
        return "null"
    return next((name for cls, name in _KINDS if isinstance(value, cls)), type(value).__name__)


def join(path: str, key: object) -> str:
    """`path.key`, or `path[key]` for a list index."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


# -- reading ------------------------------------------------------------------------------------


def read_bounded(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path` (symlinks followed); `Invalid` if it
    is larger, cannot be read, or is not a regular file.

    It is opened without blocking and checked before any read: a FIFO would block the reader
    until a writer comes (a reload thread holding its lock for ever, a start that never ends), a
    character device (`/dev/zero`) never ends, and neither is a document anyone meant to give."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise Invalid("", f"cannot read it: {error.strerror or type(error).__name__}") from error
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise Invalid("", f"not a regular file (a {_file_kind(mode)})")
    with os.fdopen(descriptor, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as error:
            raise Invalid(
                "", f"cannot read it: {error.strerror or type(error).__name__}"
            ) from error
    if len(data) > limit:
        raise Invalid("", f"larger than {size_text(limit)} (the limit)")
    return data


@contextmanager
def memory_file(data: bytes, name: str) -> Iterator[str]:
    """A path that holds `data` for as long as the block runs: an anonymous memory file of this
    process (`memfd_create`, opened by its `/proc/self/fd` path), for what only loads from a
    path (OpenSSL's certificate chains and keys). Nothing reaches a file system or a disk, so it
    works on a read-only root; `OSError` where the kernel has no memfd or `/proc` is absent."""
    descriptor = os.memfd_create(f"gpuscope-{name}", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"


def size_text(size: int) -> str:
    """`1 MiB`, `64 KiB`, `300 bytes`."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size:,} bytes"


def decode(data: bytes | str) -> str:
    """UTF-8 text (a leading byte-order mark dropped); `Invalid` naming the first bad byte."""
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise Invalid(
            "", f"not UTF-8 text (byte {error.start} is {data[error.start]:#04x})"
        ) from None


def load_file(
    path: Path,
    build: Callable[[object], T],
    error: Callable[[str], E],
    *,
    fmt: Format = "yaml",
    limit: int = MAX_DOCUMENT_BYTES,
    secret: bool = False,
    source: str | None = None,
) -> T:
    """`build(document)` for the document in the file at `path`; anything wrong raises
    `error("<source>: <path>: <problem>")` (the source defaults to the file's path)."""
    where = str(path) if source is None else source
    try:
        data = read_bounded(path, limit)
    except Invalid as problem:
        raise error(one_line(f"{where}: {problem}")) from None
    return load_text(data, build, error, fmt=fmt, limit=limit, secret=secret, source=where)


def load_text(
    data: bytes | str,
    build: Callable[[object], T],
    error: Callable[[str], E],
    *,
    source: str,
    fmt: Format = "yaml",
    limit: int = MAX_DOCUMENT_BYTES,
    secret: bool = False,
) -> T:
    """`load_file` for a document already in memory (a ConfigMap's value, a test's text)."""
    try:
        if len(data) > limit:
            raise Invalid("", f"larger than {size_text(limit)} (the limit)")
        document = parse(decode(data), fmt=fmt, secret=secret)
        return build(document)
    except Invalid as problem:
        raise error(one_line(f"{source}: {problem}" if source else str(problem))) from None
    except RecursionError:
        raise error(f"{source}: nested too deeply" if source else "nested too deeply") from None


def parse(text: str, *, fmt: Format = "yaml", secret: bool = False) -> object:
    """The document in `text`, bounded and strict; `Invalid` otherwise."""
    if fmt == "json":
        return _parse_json(text)
    return _parse_yaml(text, secret=secret)


class _StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """The safe loader, refusing a key given twice in one mapping (named only where the
    document holds no secrets)."""

    secret = False

    def construct_mapping(
        self,
        node: yaml.MappingNode,
        deep: bool = False,  # noqa: FBT001, FBT002 - PyYAML's signature
    ) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` then a key of its own overrides, by design
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:
                raise Invalid(
                    "", f"a key at line {key_node.start_mark.line + 1} is not a scalar"
                ) from None
            if repeated:
                line = key_node.start_mark.line + 1
                named = "a key" if self.secret else f"key {quote(key)}"
                raise Invalid("", f"{named} appears twice in one mapping (line {line})")
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _parse_yaml(text: str, *, secret: bool) -> object:
    loader = _StrictLoader(text)
    loader.secret = secret
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as error:
            raise Invalid("", _yaml_problem(error, secret=secret)) from None
        if node is None:
            return None
        _check_size(node)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as error:
            raise Invalid("", _yaml_problem(error, secret=secret)) from None
        except (ValueError, OverflowError, TypeError):
            # PyYAML's int, float and timestamp constructors on values they cannot read
            raise Invalid("", "not valid YAML: a value cannot be read") from None
    finally:
        loader.dispose()


def _yaml_problem(error: yaml.YAMLError, *, secret: bool) -> str:
    mark = getattr(error, "problem_mark", None)
    line = f" at line {mark.line + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None)
    if secret or not problem:
        # PyYAML's descriptions quote the text around the problem, which may be a secret.
        return f"not valid YAML{line}"
    described = str(problem)
    return f"not valid YAML{line}: {described if len(described) <= 80 else described[:80] + '…'}"


def _check_size(root: yaml.Node) -> None:
    """Refuse a node graph that expands past `MAX_NODES` or `MAX_DEPTH`, or contains itself.

    PyYAML composes an alias as a second reference to its anchor's node, so the graph is small
    even when the document it stands for is not; everything that walks the document afterwards
    (a validator, `_flatten`, a JSON dump) pays for the expansion. Sizes are counted per node
    once (memoised), without recursion.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    depth = 0
    while stack:
        node, children_done = stack.pop()
        ident = id(node)
        if children_done:
            on_path.discard(ident)
            depth -= 1
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > MAX_NODES:
                raise Invalid("", f"expands to more than {MAX_NODES:,} values (aliases repeated?)")
            sizes[ident] = size
            continue
        if ident in sizes:
            continue
        if ident in on_path:
            line = node.start_mark.line + 1
            raise Invalid("", f"an alias contains itself (line {line})")
        children = _children(node)
        if not children:
            sizes[ident] = 1
            continue
        depth += 1
        if depth > MAX_DEPTH:
            raise Invalid("", f"nested more than {MAX_DEPTH} levels deep")
        on_path.add(ident)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise Invalid("", f"key {quote(key)} appears twice in one object")
        found[key] = value
    return found


def _parse_json(text: str) -> object:
    try:
        document = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as error:
        raise Invalid("", f"not valid JSON at line {error.lineno}: {error.msg}") from None
    except RecursionError:
        raise Invalid("", "nested too deeply") from None
    depth, count = _json_extent(document)
    if depth > MAX_DEPTH:
        raise Invalid("", f"nested more than {MAX_DEPTH} levels deep")
    if count > MAX_NODES:
        raise Invalid("", f"holds more than {MAX_NODES:,} values")
    return document


def _json_extent(document: object) -> tuple[int, int]:
    deepest, count = 0, 0
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    return deepest, count


# -- checks: each takes a value and where it was found, returns it typed or raises Invalid -----

_FIELD_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


def mapping(
    value: object,
    path: str,
    *,
    required: Collection[str] = (),
    optional: Collection[str] | None = None,
    null_is_empty: bool = False,
    secret: bool = False,
) -> dict[str, Any]:
    """A mapping with string keys; `optional` given: no keys but those and `required`. In a
    document holding secrets, an unknown key is quoted only if it looks like a field name (a
    password hash or a key written in the wrong place is named by its position instead)."""
    if value is None and null_is_empty:
        return {}
    if not isinstance(value, Mapping):
        raise Invalid(path, f"expected a mapping, got {kind(value)}")
    for key in value:
        if not isinstance(key, str):
            raise Invalid(path, f"keys must be strings, got {quote(key)}")
    if optional is not None:
        unknown = [
            key if not secret or _FIELD_NAME.fullmatch(key) else f"(entry {position})"
            for position, key in enumerate(value, start=1)
            if key not in optional and key not in required
        ]
        if unknown:
            shown = ", ".join(
                key if key.startswith("(entry") else quote(key, 40) for key in unknown[:5]
            )
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise Invalid(path, f"unknown field{'s' if len(unknown) > 1 else ''} {shown}{more}")
    missing = [key for key in required if key not in value]
    if missing:
        raise Invalid(path, f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return dict(value)


def sequence(value: object, path: str, *, max_items: int = 10_000, min_items: int = 0) -> list[Any]:
    """A list of at least `min_items` and at most `max_items` entries."""
    if not isinstance(value, list):
        raise Invalid(path, f"expected a list, got {kind(value)}")
    if len(value) > max_items:
        raise Invalid(path, f"more than {max_items:,} entries")
    if len(value) < min_items:
        raise Invalid(path, f"expected at least {min_items} entr{'y' if min_items == 1 else 'ies'}")
    return value


def text(
    value: object,
    path: str,
    *,
    max_length: int = 256,
    pattern: re.Pattern[str] | None = None,
    describe: str = "",
    allow_empty: bool = False,
    printable: bool = True,
) -> str:
    """A string of at most `max_length` characters, matching `pattern` in full if given
    (`describe` then says what it should be: "a Kubernetes name")."""
    if not isinstance(value, str):
        raise Invalid(path, f"expected a string, got {kind(value)}")
    if not value and not allow_empty:
        raise Invalid(path, "must not be empty")
    if len(value) > max_length:
        raise Invalid(path, f"longer than {max_length:,} characters")
    if printable and not value.isprintable():
        raise Invalid(path, f"{quote(value)} has control characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise Invalid(path, f"{quote(value)} is not {describe or 'of the expected form'}")
    return value


def number(
    value: object,
    path: str,
    *,
    low: float | None = None,
    high: float | None = None,
    positive: bool = False,
    unit: str = "",
) -> float:
    """A finite number (not true/false), within `low`..`high`, above 0 if `positive`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(path, f"expected a number, got {kind(value)}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise Invalid(path, "must be a finite number")
    suffix = f" {unit}" if unit else ""
    if positive and result <= 0:
        raise Invalid(path, f"must be greater than 0{suffix}")
    if low is not None and result < low:
        raise Invalid(path, f"{result:g}{suffix} is below {low:g}{suffix}")
    if high is not None and result > high:
        raise Invalid(path, f"{result:g}{suffix} is above {high:g}{suffix}")
    return result


def integer(value: object, path: str, *, low: int | None = None, high: int | None = None) -> int:
    """A whole number (not true/false, not 2.0) within `low`..`high`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(
            path,
            f"expected a whole number, got {quote(value) if isinstance(value, float) else kind(value)}",
        )
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low if low is not None else '…'}..{high if high is not None else '…'}"
        raise Invalid(path, f"{quote(value)} is outside {bounds}")
    return value


def boolean(value: object, path: str) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise Invalid(path, f"expected true or false, got {quote(value)}")
    return value


def choice(value: object, path: str, choices: Collection[str]) -> str:
    """One of `choices`, spelled exactly."""
    if not isinstance(value, str) or value not in choices:
        raise Invalid(path, f"{quote(value)} is not one of {', '.join(choices)}")
    return value


def strings(
    value: object, path: str, *, max_items: int = 1000, max_length: int = 256
) -> tuple[str, ...]:
    """A list of strings."""
    return tuple(
        text(item, join(path, index), max_length=max_length)
        for index, item in enumerate(sequence(value, path, max_items=max_items))
    )


def attempt(path: str, parse: Callable[[], T]) -> T:
    """`parse()`, its `ValueError` (a duration's, a size's) turned into `Invalid` at `path`."""
    try:
        return parse()
    except ValueError as error:
        raise Invalid(path, str(error)) from None
