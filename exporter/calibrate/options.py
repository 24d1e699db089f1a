"""`gpuscope calibrate`'s flags, parsed and checked before anything heavy is imported.

Kept free of PyTorch, rich and the Kubernetes client, so `gpuscope calibrate --help` and a bad
flag answer at once, and the absence of the `calibrate` extra is reported in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from exporter.calibration.profile import format_for

if TYPE_CHECKING:
    import argparse

    from exporter.documents import Format

EXTRA_MODULES: Final = frozenset({"torch", "rich", "kubernetes"})
"""What `pip install 'gpuscope[calibrate]'` brings; missing any of them is the same one fix."""
INSTALL_HINT: Final = (
    "gpuscope calibrate needs PyTorch and the calibrate extra: pip install 'gpuscope[calibrate]'"
)

_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DEVICE: Final = re.compile(r"auto|cpu|cuda(:\d{1,3})?")


class OptionError(Exception):
    """A calibrate flag that cannot be used; `str()` names it and says why."""


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    device: str = "auto"
    quick: bool = False
    output: Path | None = None
    output_format: Format = "json"
    to_stdout: bool = True
    """Print the profile (JSON): asked for with `--output -`, the default without --configmap."""
    configmap: tuple[str, str] | None = None
    """(namespace, name) of the ConfigMap to merge the profile into."""
    kubeconfig: Path | None = None
    catalog_file: Path | None = None
    log_level: str = "info"
    log_format: str = "logfmt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help="auto (the first GPU torch sees, else the CPU), cpu, cuda or cuda:N (default: auto)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: one size per measurement, fewer and shorter trials",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="write the profile to FILE (.json, .yaml or .yml); - for standard output, the "
        "default when no --configmap is given",
    )
    parser.add_argument(
        "--configmap",
        metavar="NAMESPACE/NAME",
        help="merge the profile into this ConfigMap under the model's key (created if missing; "
        "other models' keys are kept)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for --configmap (default: in-cluster, else the KUBECONFIG environment)",
    )
    parser.add_argument(
        "--catalog.file",
        dest="catalog_file",
        metavar="FILE",
        help="a GPU catalog laid over the built-in one, for the datasheet figures in the profile",
    )
    parser.add_argument(
        "--log.level", dest="log_level", default="info", choices=("debug", "info", "warn", "error")
    )
    parser.add_argument(
        "--log.format", dest="log_format", default="logfmt", choices=("logfmt", "json")
    )


def parse(args: argparse.Namespace) -> CalibrateOptions:
    """Check the flags; raises `OptionError` naming the first bad one."""
    device = str(args.device).strip().lower()
    if not _DEVICE.fullmatch(device):
        raise OptionError(f"invalid --device: {args.device!r} is not auto, cpu, cuda or cuda:N")
    output: Path | None = None
    output_format: Format = "json"
    if args.output not in {None, "-"}:
        output = Path(args.output)
        found = format_for(output.name)
        if found is None:
            raise OptionError(f"invalid --output: {args.output!r} must end in .json, .yaml or .yml")
        output_format = found
        if not output.parent.is_dir():
            raise OptionError(f"invalid --output: directory {str(output.parent)!r} does not exist")
    configmap = None
    if args.configmap is not None:
        namespace, _, name = str(args.configmap).partition("/")
        if not _NAMESPACE.fullmatch(namespace) or not _NAME.fullmatch(name):
            raise OptionError(
                f"invalid --configmap: {args.configmap!r} is not NAMESPACE/NAME "
                "(lower-case DNS names)"
            )
        configmap = (namespace, name)
    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
    if kubeconfig is not None and not kubeconfig.is_file():
        raise OptionError(f"invalid --kubeconfig: {args.kubeconfig!r} is not a readable file")
    catalog_file = Path(args.catalog_file) if args.catalog_file else None
    if catalog_file is not None and not catalog_file.is_file():
        raise OptionError(f"invalid --catalog.file: {args.catalog_file!r} is not a readable file")
    return CalibrateOptions(
        device=device,
        quick=bool(args.quick),
        output=output,
        output_format=output_format,
        to_stdout=args.output == "-" or (args.output is None and configmap is None),
        configmap=configmap,
        kubeconfig=kubeconfig,
        catalog_file=catalog_file,
        log_level=args.log_level,
        log_format=args.log_format,
    )
