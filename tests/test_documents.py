"""The one way documents are read and checked (`exporter.documents`), and settings declared
(`exporter.settings`): bounded, strict, one line, whatever the input."""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter import documents
from exporter.settings import (
    ConfigError,
    Setting,
    SettingsTable,
    count_between,
    parse_safe_regex,
    text,
)
from tests.yaml_bombs import alias_bomb

pytestmark = pytest.mark.timeout(30)


class Bad(ValueError):
    pass


def load(data: bytes | str, *, fmt: documents.Format = "yaml", secret: bool = False) -> object:
    return documents.load_text(
        data, lambda document: document, Bad, source="doc", fmt=fmt, secret=secret
    )


def test_an_alias_bomb_is_refused_before_anything_walks_it() -> None:
    started = time.monotonic()
    with pytest.raises(Bad, match=r"^doc: expands to more than 100,000 values"):
        load(alias_bomb())
    assert time.monotonic() - started < 5


def test_aliases_within_the_budget_still_work() -> None:
    assert load("base: &b {x: 1}\ncopy: *b\nmerged: {<<: *b, y: 2}\n") == {
        "base": {"x": 1},
        "copy": {"x": 1},
        "merged": {"x": 1, "y": 2},
    }


def test_an_alias_inside_itself_is_refused() -> None:
    with pytest.raises(Bad, match="an alias contains itself"):
        load("a: &a [1, *a]\n")


@pytest.mark.parametrize(
    ("document", "fmt", "problem"),
    [
        ("a: 1\nb: 2\na: 3\n", "yaml", "key 'a' appears twice in one mapping (line 3)"),
        ('{"a": 1, "a": 2}', "json", "key 'a' appears twice in one object"),
        ("[" * 100 + "]" * 100, "yaml", "nested more than 64 levels deep"),
        ("[" * 100 + "]" * 100, "json", "nested more than 64 levels deep"),
        ("[" * 100_000 + "]" * 100_000, "json", "nested too deeply"),
        ("[" * 100_000 + "]" * 100_000, "yaml", "not valid YAML"),
        ("x: [1, 2\n", "yaml", "not valid YAML at line 2"),
        ("{1: 2", "json", "not valid JSON at line 1"),
        ("x: !!float abc\n", "yaml", "a value cannot be read"),
        ("{[1]: 2}\n", "yaml", "a key at line 1 is not a scalar"),
        ("x: !!python/object:os.system {}\n", "yaml", "not valid YAML"),
    ],
)
def test_strict_documents(document: str, fmt: documents.Format, problem: str) -> None:
    with pytest.raises(Bad, match=re.escape(problem)) as caught:
        load(document, fmt=fmt)
    assert str(caught.value).startswith("doc: ")
    assert "\n" not in str(caught.value)


def test_text_must_be_utf8() -> None:
    with pytest.raises(Bad, match=r"not UTF-8 text \(byte 2 is 0xff\)"):
        load(b"a:\xff\xfe")
    assert load("\ufeffa: 1\n".encode()) == {"a": 1}  # a byte-order mark is fine


def test_a_secret_documents_syntax_errors_quote_nothing() -> None:
    with pytest.raises(Bad) as caught:
        load("users:\n  alice: [$2b$10$secret-hash-text\n", secret=True)
    assert "secret" not in str(caught.value)
    assert str(caught.value) == "doc: not valid YAML at line 3"


def test_files_are_read_only_up_to_their_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2048)
    with pytest.raises(Bad, match=r"big.yaml: larger than 1 KiB \(the limit\)"):
        documents.load_file(big, lambda d: d, Bad, limit=1024)
    with pytest.raises(Bad, match=r"urandom: not a regular file \(a character device\)"):
        documents.load_file(
            __import__("pathlib").Path("/dev/urandom"), lambda d: d, Bad, limit=64 * 1024
        )
    with pytest.raises(Bad, match=r"absent.yaml: cannot read it: No such file or directory"):
        documents.load_file(tmp_path / "absent.yaml", lambda d: d, Bad)


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    """A FIFO would block the reader until someone writes to it (at start, or in a reload
    thread holding its lock); a device or a directory is no document either. Each is refused in
    one line, at once, without reading."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(Bad, match=r"config.yaml: not a regular file \(a FIFO\)$"):
        documents.load_file(fifo, lambda d: d, Bad)
    with pytest.raises(Bad, match=r"zero: not a regular file \(a character device\)$"):
        documents.load_file(Path("/dev/zero"), lambda d: d, Bad)
    with pytest.raises(Bad, match=r": not a regular file \(a directory\)$"):
        documents.load_file(tmp_path, lambda d: d, Bad)
    link = tmp_path / "link.yaml"
    target = tmp_path / "target.yaml"
    target.write_text("a: 1\n")
    link.symlink_to(target)  # a mounted ConfigMap's files are symlinks to regular files
    assert documents.load_file(link, lambda d: d, Bad) == {"a": 1}


def test_quoted_values_are_cut() -> None:
    quoted = documents.quote("x" * 50_000_000)
    assert len(quoted) < 100
    assert quoted.endswith("(50,000,000 characters)")
    assert len(documents.one_line("y" * 10_000)) == documents.MAX_MESSAGE


def test_checks_name_the_key_path() -> None:
    def build(document: object) -> object:
        top = documents.mapping(document, "", optional=("gpus",))
        for index, gpu in enumerate(documents.sequence(top["gpus"], "gpus")):
            entry = documents.mapping(gpu, documents.join("gpus", index), required=("memory",))
            documents.integer(entry["memory"], documents.join(f"gpus[{index}]", "memory"), low=1)
        return top

    cases = {
        "gpus: [{memory: 1}, {memory: 0}]": "doc: gpus[1].memory: 0 is outside 1..…",
        "gpus: [{memory: 1}, {}]": "doc: gpus[1]: missing field memory",
        "gpus: [{memory: true}]": "doc: gpus[0].memory: expected a whole number, got true/false",
        "gpus: []\ncpus: 1": "doc: unknown field 'cpus'",
        "gpus: 3": "doc: gpus: expected a list, got a number",
    }
    for document, message in cases.items():
        with pytest.raises(Bad) as caught:
            documents.load_text(document, build, Bad, source="doc")
        assert str(caught.value) == message


@pytest.mark.parametrize(
    ("pattern", "accepted"),
    [
        ("team|app", True),
        ("app\\.kubernetes\\.io/.*", True),
        (".*", True),
        ("(a+)+$", False),
        ("(a*)*", False),
        ("(a|ab)*", False),
        ("(a)\\1", False),
        ("(?=a)a", False),
        (".*a.*b.*c.*d", False),
    ],
)
def test_label_patterns_that_could_backtrack_for_ever_are_refused(
    pattern: str, accepted: bool
) -> None:
    if accepted:
        compiled = parse_safe_regex(pattern)
        # the worst accepted shape on the longest label name Kubernetes allows is quick
        started = time.monotonic()
        for name in ("a" * 316 + "!", "ab" * 158, "app.kubernetes.io/" + "x" * 299):
            compiled.fullmatch(name)
        assert time.monotonic() - started < 1
    else:
        with pytest.raises(ValueError, match=r"is refused: .* can make matching"):
            parse_safe_regex(pattern)


def test_the_accepted_worst_case_is_polynomial_and_quick() -> None:
    compiled = parse_safe_regex(".*a.*b.*c")
    started = time.monotonic()
    compiled.fullmatch("a" * 100 + "b" * 100 + "x" * 117)  # 317 characters, no final c
    assert time.monotonic() - started < 2


@dataclass(frozen=True)
class _Options:
    config_file: str | None = None
    name: str = "x"
    count: int = 1
    tags: tuple[str, ...] = ()
    url: str | None = None


_TABLE = SettingsTable(
    (
        Setting("config.file", "config_file", text, "the file", flag_only=True),
        Setting("name", "name", text, "a name"),
        Setting("count", "count", count_between(1, 9), "a count", group="numbers"),
        Setting("tag", "tags", lambda items: tuple(map(text, items)), "tags", repeated=True),
        Setting("url", "url", text, "where", required=True),
    ),
    _Options(),
    env_prefix="TEST_",
)


def _load(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    _TABLE.add_arguments(parser)
    return _TABLE.load(vars(parser.parse_args(argv)), environ or {})


def test_a_settings_table_reads_flags_environment_and_file(tmp_path: Path) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text("name: from-file\ncount: 3\ntag: [a, b]\nurl: http://x\n")
    found = _load([f"--config.file={file}", "--tag", "c", "--tag", "d,e"], {"TEST_COUNT": "4"})
    assert found == {
        "config_file": str(file),
        "name": "from-file",
        "count": 4,
        "tags": ("c", "d", "e"),
        "url": "http://x",
    }
    assert _load(["--url=u"], {"TEST_TAG": "x, y"})["tags"] == ("x", "y")


def test_a_settings_table_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^invalid --url: required \(the flag, TEST_URL"):
        _load([])
    with pytest.raises(ConfigError, match=r"^invalid TEST_COUNT: '12' is outside 1..9$"):
        _load(["--url=u"], {"TEST_COUNT": "12"})
    file = tmp_path / "bomb.yaml"
    file.write_text(alias_bomb())
    with pytest.raises(ConfigError, match=r"^invalid --config.file: .*bomb.yaml: expands"):
        _load([f"--config.file={file}"])


def test_a_settings_table_documents_itself() -> None:
    table = _TABLE.table()
    assert "| `--url` | `TEST_URL` |  | where Required. |" in table
    assert "| `--count` | `TEST_COUNT` | `1` | a count |" in table
    with pytest.raises(TypeError, match="settings without a field of the defaults: nope"):
        SettingsTable((Setting("nope", "nope", text, "?"),), _Options())
