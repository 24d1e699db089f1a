"""gpuscope: GPU monitoring and rightsizing for shared Kubernetes GPU clusters."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("gpuscope")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
