"""Settings declared once: a flag, an environment variable and a config-file key from one row.

Each of gpuscope's commands (`serve`, `rightsize`, `calibrate`) declares its settings as a
`SettingsTable` of `Setting` rows and a frozen dataclass of defaults. From a row come the flag
(`--collect.interval`), the variable (`GPUSCOPE_COLLECT_INTERVAL`), the key of the optional YAML
file given with `--config.file` (`collect: {interval: 1s}`), `--help`, and the docs' flag
table. Precedence is flag > environment > file > default. A value that cannot be used raises
`ConfigError` with one line naming where it came from; the commands exit with status 2.

The value parsers below take what a flag, a variable or a YAML file holds (a string, or a
number, a boolean or a list from YAML) and return the typed value, or raise `ValueError` with a
message that completes "invalid --x: ...", quoting at most `documents.QUOTE_LIMIT` characters of
what it was given.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any, Final, NoReturn

from exporter import documents
from exporter.documents import one_line, quote
from exporter.durations import format_duration, parse_duration_between

ENV_PREFIX: Final = "GPUSCOPE_"
CONFIG_FILE_LIMIT: Final = documents.MAX_DOCUMENT_BYTES
PATH_QUOTE_LIMIT: Final = 256
"""Paths are quoted longer than other values: their end is what tells them apart."""


class ConfigError(Exception):
    """A setting that cannot be used. `str()` is a complete one-line explanation."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(one_line(f"invalid {setting}: {problem}"))
        self.setting = setting


class CommandParser(argparse.ArgumentParser):
    """argparse as every gpuscope command uses it.

    A flag is spelled whole (no abbreviations: `--sim` would otherwise mean `--simulate`, and
    stop meaning it the day another flag starts with it). A command line it refuses gets the
    command's usage in one line, then the error, exit status 2; an unknown flag's error names
    the nearest flag the command has ("did you mean --simulate?"), and a subcommand's unknown
    flag is reported by the subcommand (`gpuscope serve`), not by `gpuscope`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parser = self._command(parsed) or self
            parser.error(parser.unrecognized(unknown))
        return parsed

    def unrecognized(self, arguments: Sequence[str]) -> str:
        """The error for arguments this parser has no use for, with the nearest flag to each
        unknown one."""
        flags = [flag for action in self._actions for flag in action.option_strings]
        hints = []
        for argument in arguments:
            if not argument.startswith("--"):
                continue
            nearest = difflib.get_close_matches(argument.partition("=")[0], flags, n=1)
            if nearest and nearest[0] not in hints:
                hints.append(nearest[0])
        hint = f" (did you mean {' or '.join(hints)}?)" if hints else ""
        return f"unrecognized arguments: {' '.join(arguments)}{hint}"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.short_usage()}\n{self.prog}: error: {message}\n")

    def short_usage(self) -> str:
        """One line instead of argparse's usage, which lists every flag (thirty lines for
        `serve`) above the one line that matters."""
        return f"usage: {self.prog} [FLAG ...]   ({self.prog} --help lists them)"

    def _command(self, parsed: argparse.Namespace) -> CommandParser | None:
        """The subcommand's parser that `parsed` went through, if any."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, CommandParser):
                    return chosen
        return None


@dataclass(frozen=True, slots=True)
class Setting:
    """One configurable value: its dotted name, where it lands, how it is read, its help."""

    name: str
    attribute: str
    parse: Callable[[object], Any]
    help: str
    metavar: str = "VALUE"
    flag_only: bool = False
    """Only a flag or variable (the config file's own name)."""
    fallback_env: str | None = None
    """A variable outside the GPUSCOPE_ namespace that, when set, replaces the default."""
    switch: bool = False
    """A boolean given as `--name` / `--no-name` on the command line (node_exporter's style)."""
    repeated: bool = False
    """A list: the flag may be repeated; the variable and a YAML string are comma-separated."""
    separator: str = ","
    """What separates a repeated setting's values in one string (a newline where a value may
    hold commas, as an HTTP header's does)."""
    required: bool = False
    group: str = ""
    """The `--help` section it is listed in."""
    shown_default: str | None = None
    """The default as `--help` and the docs show it, where `str()` of the value would not do."""
    env_prefix: str = ENV_PREFIX
    """Set by the `SettingsTable` the setting is in."""
    file_key: str | None = None
    """Its dotted key in the config file where that is not its name: a switch whose name is also
    the prefix of other settings (`kubernetes.node-condition` beside
    `kubernetes.node-condition.recovery`) cannot be both a value and a mapping in YAML, so the
    file spells it `kubernetes.node-condition.enabled`."""

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return self.env_prefix + re.sub(r"[.-]", "_", self.name).upper()


@dataclass(frozen=True)
class SettingsTable:
    """A command's settings: the rows, the dataclass of defaults, and the variables' prefix."""

    settings: tuple[Setting, ...]
    defaults: object
    env_prefix: str = ENV_PREFIX

    def __post_init__(self) -> None:
        names = {field.name for field in fields(self.defaults)}  # type: ignore[arg-type]
        strays = [s.attribute for s in self.settings if s.attribute not in names]
        if strays:
            raise TypeError(f"settings without a field of the defaults: {', '.join(strays)}")
        prefixed = tuple(replace(s, env_prefix=self.env_prefix) for s in self.settings)
        object.__setattr__(self, "settings", prefixed)

    @property
    def by_name(self) -> dict[str, Setting]:
        return {setting.name: setting for setting in self.settings}

    def default(self, setting: Setting) -> object:
        return getattr(self.defaults, setting.attribute)

    def shown_default(self, setting: Setting) -> str:
        if setting.shown_default is not None:
            return setting.shown_default
        return describe(self.default(setting))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare every setting as a flag. Values stay raw until `load` parses them."""
        groups: dict[str, argparse._ActionsContainer] = {"": parser}
        for setting in self.settings:
            if setting.group not in groups:
                groups[setting.group] = parser.add_argument_group(setting.group)
            target = groups[setting.group]
            shown = self.shown_default(setting)
            default = f" (default: {shown})" if shown else ""
            required = " (required)" if setting.required else ""
            help_text = f"{setting.help}{default}{required} [env {setting.env}]"
            if setting.switch:
                target.add_argument(
                    f"--{setting.name}",
                    dest=setting.attribute,
                    nargs="?",
                    const="true",
                    metavar=setting.metavar,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
                target.add_argument(
                    f"--no-{setting.name}",
                    dest=setting.attribute,
                    action="store_const",
                    const="false",
                    default=argparse.SUPPRESS,
                    help=f"The opposite of --{setting.name}.",
                )
                continue
            target.add_argument(
                f"--{setting.name}",
                dest=setting.attribute,
                metavar=setting.metavar,
                action="append" if setting.repeated else "store",
                default=argparse.SUPPRESS,
                help=help_text,
            )

    def load(
        self, flags: Mapping[str, object], environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Typed values by attribute from parsed flags (keyed by attribute), the environment
        and the config file; only settings given somewhere appear. Raises `ConfigError`."""
        environ = os.environ if environ is None else environ
        by_attribute = {setting.attribute: setting for setting in self.settings}
        sources: dict[str, tuple[Setting, str, object]] = {
            s.attribute: (s, s.fallback_env, environ[s.fallback_env])
            for s in self.settings
            if s.fallback_env is not None and environ.get(s.fallback_env)
        }
        from_env = {
            s.attribute: (s, s.env, environ[s.env]) for s in self.settings if s.env in environ
        }
        from_flags = {
            attribute: (by_attribute[attribute], by_attribute[attribute].flag, value)
            for attribute, value in flags.items()
            if attribute in by_attribute
        }
        config_file = from_flags.get("config_file") or from_env.get("config_file")
        if config_file is not None:
            path = _parse(*config_file)
            for setting, value in self.read_file(Path(path)).items():
                sources[setting.attribute] = (setting, f"{setting.name} in {path}", value)
        sources.update(from_env)
        sources.update(from_flags)
        for setting in self.settings:
            if setting.required and setting.attribute not in sources:
                raise ConfigError(
                    setting.flag,
                    f"required (the flag, {setting.env} or {setting.name} in --config.file)",
                )
        return {attribute: _parse(*source) for attribute, source in sources.items()}

    def read_file(self, path: Path) -> dict[Setting, object]:
        """The settings a `--config.file` holds, nested at the dots; raises `ConfigError`."""
        by_name = {
            setting.file_key or setting.name: setting
            for setting in self.settings
            if not setting.flag_only
        }
        respelled = {s.name: s.file_key for s in self.settings if s.file_key is not None}

        def settings_in(document: object) -> dict[Setting, object]:
            if document is None:
                return {}
            found: dict[Setting, object] = {}
            for name, value in _flatten(documents.mapping(document, ""), ""):
                if name in respelled:
                    raise documents.Invalid(name, f"spelled {respelled[name]} in the file")
                if name not in by_name:
                    raise documents.Invalid(name, "unknown setting")
                found[by_name[name]] = value
            return found

        def error(message: str) -> ConfigError:
            return ConfigError("--config.file", message)

        return documents.load_file(path, settings_in, error, limit=CONFIG_FILE_LIMIT)

    def table(self) -> str:
        """The Markdown flag table for the docs (tests/test_docs.py keeps the docs equal to it)."""
        rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
        for setting in self.settings:
            shown = self.shown_default(setting)
            flag = f"--[no-]{setting.name}" if setting.switch else f"--{setting.name}"
            default = f"`{shown}`" if shown else ""
            meaning = setting.help + (" Required." if setting.required else "")
            if setting.file_key is not None:
                meaning += f" In `--config.file`: `{setting.file_key}`."
            rows.append(f"| `{flag}` | `{setting.env}` | {default} | {meaning} |")
        return "\n".join(rows)


def _parse(setting: Setting, source: str, value: object) -> Any:
    if setting.repeated:
        value = _items(value, setting.separator)
    try:
        return setting.parse(value)
    except ValueError as error:
        raise ConfigError(source, str(error)) from error


def _items(value: object, separator: str) -> list[object]:
    """A repeated setting's values: the flag's list, a YAML list, or text split at `separator`."""
    if isinstance(value, list):
        return [
            part
            for item in value
            for part in (_split(item, separator) if isinstance(item, str) else [item])
        ]
    if isinstance(value, str):
        return list(_split(value, separator))
    return [value]


def _split(text: str, separator: str) -> list[str]:
    return [part.strip() for part in text.split(separator) if part.strip()]


def _flatten(document: Mapping[str, Any], prefix: str) -> list[tuple[str, object]]:
    items: list[tuple[str, object]] = []
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items.extend(_flatten(documents.mapping(value, name), f"{name}."))
        else:
            items.append((name, value))
    return items


def describe(value: object) -> str:
    """A default as `--help` and the docs show it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format_duration(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


# -- value parsers -------------------------------------------------------------------------------


def text(value: object) -> str:
    """A string (a number from YAML becomes its text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a string, got {documents.kind(value)}")
    return str(value)


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    spelled = text(value).strip().lower()
    if spelled in {"true", "1", "yes", "on"}:
        return True
    if spelled in {"false", "0", "no", "off"}:
        return False
    raise ValueError(f"{quote(spelled)} is not a boolean (true or false)")


def one_of(*choices: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        spelled = text(value).strip().lower()
        if spelled not in choices:
            raise ValueError(f"{quote(spelled)} is not one of {', '.join(choices)}")
        return spelled

    return parse


def duration_between(low: float, high: float) -> Callable[[object], float]:
    def parse(value: object) -> float:
        return parse_duration_between(text(value), low, high)

    return parse


def count_between(low: int, high: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        spelled = text(value).strip()
        if not spelled.isascii() or not spelled.isdigit():
            raise ValueError(f"{quote(spelled)} is not a whole number")
        number = int(spelled) if len(spelled) <= 12 else high + 1
        if not low <= number <= high:
            raise ValueError(f"{quote(spelled)} is outside {low}..{high}")
        return number

    return parse


def percent_between(low: float, high: float) -> Callable[[object], float]:
    """A percentage written as percent (`20` or `20%`), held as a ratio (0.2)."""

    def parse(value: object) -> float:
        spelled = text(value).strip().removesuffix("%")
        try:
            percent = float(spelled)
        except ValueError:
            raise ValueError(f"{quote(text(value))} is not a percentage (e.g. 20 or 20%)") from None
        if not math.isfinite(percent) or not low <= percent <= high:
            raise ValueError(f"{percent:g}% is outside {low:g}..{high:g}%")
        return percent / 100

    return parse


MAX_CARBON_INTENSITY: Final = 10_000.0
"""gCO2e/kWh: ten times the dirtiest grid's, so that a figure in the wrong unit is refused."""


def parse_carbon_intensity(value: object) -> float:
    spelled = text(value).strip()
    try:
        number = float(spelled)
    except ValueError:
        raise ValueError(f"{quote(spelled)} is not a number of gCO2e/kWh") from None
    if not math.isfinite(number) or not 0.0 <= number <= MAX_CARBON_INTENSITY:
        raise ValueError(f"{quote(spelled)} is outside 0..{MAX_CARBON_INTENSITY:g} gCO2e/kWh")
    return number


def parse_path(value: object) -> Path:
    spelled = text(value)
    if not spelled or "\x00" in spelled:
        raise ValueError(f"{quote(spelled, PATH_QUOTE_LIMIT)} is not a path")
    return Path(spelled)


def parse_existing_path(value: object) -> Path:
    path = parse_path(value)
    if not path.exists():
        raise ValueError(f"{quote(str(path), PATH_QUOTE_LIMIT)}: no such file or directory")
    return path


def parse_file(value: object) -> Path:
    path = parse_path(value)
    if not path.is_file():
        raise ValueError(f"{quote(str(path), PATH_QUOTE_LIMIT)} is not a readable file")
    return path


MAX_REGEX_LENGTH: Final = 1024
MAX_UNBOUNDED_REPEATS: Final = 3


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """Where an HTTP server listens; `host` None means every interface."""

    host: str | None
    port: int

    def __str__(self) -> str:
        host = self.host or ""
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def listen_address(port: int) -> Callable[[object], ListenAddress]:
    """A parser of `host:port`, `:port` (every interface) or `[v6]:port`; its errors give
    examples with `port`, the server's own."""

    def parse(value: object) -> ListenAddress:
        spelled = text(value).strip()
        match = re.fullmatch(
            r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\[\]:]*)):(?P<port>\d{1,5})", spelled
        )
        if match is None:
            raise ValueError(
                f"{quote(spelled)} is not host:port (e.g. :{port}, 127.0.0.1:{port}, [::1]:{port})"
            )
        number = int(match["port"])
        if number > 65535:
            raise ValueError(f"port {number} is out of range 0-65535")
        return ListenAddress(match["v6"] or match["host"] or None, number)

    return parse


def parse_safe_regex(value: object) -> re.Pattern[str]:
    """A regular expression that cannot backtrack catastrophically.

    Python's `re` backtracks, with no time limit: `(a+)+$` takes longer than the universe's age
    on a 300-character label name. So a pattern is refused when it has a repetition inside a
    repetition (`(a+)+`, `(a*b?)*`), alternatives under a repetition (`(a|ab)*`), a
    backreference or a lookaround, or more than three unbounded repetitions (`.*a.*b.*c.*`);
    what is left runs in time polynomial of small degree in the text's length.
    """
    spelled = text(value)
    if len(spelled) > MAX_REGEX_LENGTH:
        raise ValueError(f"longer than {MAX_REGEX_LENGTH} characters")
    try:
        pattern = re.compile(spelled)
    except re.error as error:
        raise ValueError(f"{quote(spelled)} is not a regular expression: {error}") from error
    problem = _backtracking(sre_parse.parse(spelled))
    if problem:
        raise ValueError(
            f"{quote(spelled)} is refused: {problem} can make matching one long label name "
            "take minutes or more"
        )
    return pattern


def _backtracking(parsed: Any) -> str:
    """Why the parsed pattern could backtrack catastrophically, or ''."""
    unbounded = 0
    stack: list[tuple[Any, bool]] = [(parsed, False)]
    while stack:
        items, repeated = stack.pop()
        for op, argument in items:
            if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, _POSSESSIVE_REPEAT):
                _, high, body = argument
                if high == sre_constants.MAXREPEAT:
                    unbounded += 1
                if repeated and high > 1:
                    return "a repetition inside a repetition"
                stack.append((body, repeated or high > 1))
            elif op == sre_constants.BRANCH:
                if repeated:
                    return "alternatives under a repetition"
                stack.extend((branch, repeated) for branch in argument[1])
            elif op == sre_constants.SUBPATTERN:
                stack.append((argument[-1], repeated))
            elif op in (sre_constants.GROUPREF, sre_constants.GROUPREF_EXISTS):
                return "a backreference"
            elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
                return "a lookaround"
            elif op == _ATOMIC_GROUP:
                stack.append((argument, repeated))
    if unbounded > MAX_UNBOUNDED_REPEATS:
        return f"more than {MAX_UNBOUNDED_REPEATS} unbounded repetitions"
    return ""


_POSSESSIVE_REPEAT: Final = getattr(sre_constants, "POSSESSIVE_REPEAT", None)
_ATOMIC_GROUP: Final = getattr(sre_constants, "ATOMIC_GROUP", None)
