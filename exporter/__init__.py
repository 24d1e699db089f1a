"""gpuscope: GPU monitoring and rightsizing for shared Kubernetes GPU clusters."""

__version__ = "0.1.0"
"""The package's version, declared here once (pyproject.toml reads it). A constant rather than
`importlib.metadata.version()`: that lookup scans every installed distribution and costs the
daemon about 2.5 MiB of resident memory."""
