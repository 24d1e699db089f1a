"""The optional parts of the install (pyproject.toml's extras) and the one-line refusal when one is
missing.

The core install is what `gpuscope serve` imports, so every GPU node pulls only that. The jobs'
libraries (`gpuscope[rightsize]`, `gpuscope[calibrate]`) and the Kubernetes client that a
kubeconfig's `auth-provider` needs (`gpuscope[auth-providers]`) are extras. A command that needs
one checks that it is installed before importing any of it — without importing it, so a check
costs no memory — and refuses in one line naming the extra and the command that installs it.
"""

from __future__ import annotations

import importlib.util
from typing import Final

EXTRAS: Final[dict[str, tuple[str, ...]]] = {
    "rightsize": ("aiohttp", "rich", "jinja2", "kubernetes", "numpy"),
    "calibrate": ("torch", "numpy", "rich", "kubernetes"),
    "auth-providers": ("kubernetes",),
}
"""Each extra's requirements as the modules they install (tests/test_cli_errors.py keeps this equal to
pyproject.toml's optional dependencies)."""


class MissingExtra(Exception):
    """An extra a command needs is not installed; `str()` says which and how to install it."""


def absent(extra: str) -> tuple[str, ...]:
    """The modules of `extra` that are not installed (none imported to find out)."""
    return tuple(module for module in EXTRAS[extra] if importlib.util.find_spec(module) is None)


def install_hint(extra: str) -> str:
    """What a user types to add `extra` to an install."""
    return f"pip install 'gpuscope[{extra}]'"


def require(extra: str) -> None:
    """Raise `MissingExtra` unless every module of `extra` is installed. Its text completes what
    names the need: "gpuscope rightsize: needs gpuscope[rightsize] (aiohttp not installed): pip
    install 'gpuscope[rightsize]'"."""
    missing = absent(extra)
    if missing:
        raise MissingExtra(
            f"needs gpuscope[{extra}] ({', '.join(missing)} not installed): {install_hint(extra)}"
        )
