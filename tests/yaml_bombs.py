"""Hostile YAML for the tests of every reader of documents (tests/test_documents.py and the
tests of each file a user hands gpuscope: profiles, catalogs, fleets, config files)."""

from __future__ import annotations


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Nine levels of mappings, each repeating the previous one nine times by alias: 9^9 values."""
    keys = [f"k{n}" for n in range(width)]
    lines = ["l0: &l0 {" + ", ".join(f"{key}: 1" for key in keys) + "}"]
    for level in range(1, levels):
        body = ", ".join(f"{key}: *l{level - 1}" for key in keys)
        lines.append(f"l{level}: &l{level} {{{body}}}")
    return "\n".join(lines) + "\n"
