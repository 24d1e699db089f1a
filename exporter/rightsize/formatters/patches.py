"""The `patches` format: a directory of ready-to-apply changes (`--format patches --output DIR`).

One file per workload with a recommended change, named after it
(`<namespace>.<kind>.<name>.yaml`, the cluster first when there is one): the strategic-merge
patch of its owner object, headed by comments saying why, what it saves and how to apply it; and
`apply.sh`, the `kubectl patch` commands in the report's order (most saved first), each under a
comment with its reason and saving. A change that cannot be applied to the running object (a
Job's pod template, a bare Pod's resources) is a commented-out command for its manifest, and one
gpuscope cannot write as a patch is a comment saying what to change, and one whose names
Kubernetes would refuse (a forged label: `names.py`) a comment saying it was skipped. With
`--simulate`, the winning placement's set beside them (`placement_files`). Every name
is quoted for the shell, given as `--flag=value` or after `--`, and every comment is one line
without control or bidirectional-override characters, whatever the labels held.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Final

import yaml

from exporter.rightsize.formatters.common import timestamp, workload_label
from exporter.rightsize.names import comment_text
from exporter.rightsize.report import money_text

if TYPE_CHECKING:
    from exporter.rightsize.patches import Patch
    from exporter.rightsize.replay.patchset import PlacementPatches
    from exporter.rightsize.report import Report
    from exporter.rightsize.row import WorkloadRow

SCRIPT: Final = "apply.sh"
PLACEMENT_SCRIPT: Final = "apply-placement.sh"
PLACEMENT: Final = "placement."
"""The start of the winning placement's file names (`--simulate`)."""
MARK: Final = "# gpuscope rightsize patch"
"""The first line of every patch file: files that start with it are the job's to replace."""


def _heading(row: WorkloadRow, patch: Patch) -> list[str]:
    saving = row.savings
    lines = [
        f"{workload_label(row)} ({patch.kind}"
        + (f", container {patch.container})" if patch.container else ")"),
        f"{row.recommendation.classification}: {row.recommendation.reason}",
        f"confidence {row.confidence_level}"
        + (f", saves {money_text(saving)} a month" if saving else ""),
        *patch.changes,
    ]
    if patch.note:
        lines.append(f"Note: {patch.note}")
    return [comment_text(line) for line in lines]


def patch_files(report: Report) -> dict[str, str]:
    """File name -> text: a patch per workload with a change, and `apply.sh`."""
    files: dict[str, str] = {}
    script = [
        "#!/bin/sh",
        f"# gpuscope rightsize: the changes recommended by the report of {timestamp(report.end)}",
        comment_text(f"# from {report.source}; review each patch before applying it."),
        "# Paths are relative to this script; run it from anywhere.",
        "set -eu",
        'cd "$(dirname "$0")"',
    ]
    changes = [(row, patch) for row in report.rows if (patch := row.patch) is not None]
    for row, patch in changes:
        heading = _heading(row, patch)
        script += ["", *(f"# {line}" for line in heading)]
        if patch.body is None:
            script.append("# (no patch: change it by hand, as said above)")
            continue
        name = _unique(patch.file, files)
        command = shlex.join(patch.command(name))
        files[name] = "\n".join(
            [
                MARK,
                *(f"# {line}" for line in heading),
                f"# Apply: {comment_text(command)}",
                yaml.safe_dump(patch.body, sort_keys=False, allow_unicode=True),
            ]
        )
        script.append(command if patch.live else f"# {comment_text(command)}")
    if not changes:
        script += ["", "# Nothing to change: every workload is kept."]
    files[SCRIPT] = "\n".join(script) + "\n"
    if report.placement_patches is not None:
        placement_files(report.placement_patches, report, files)
    return files


def placement_files(placement: PlacementPatches, report: Report, files: dict[str, str]) -> None:
    """Into `files`, the winning placement's set (`--simulate`): its ConfigMaps and pod patches,
    each file named `placement.*` (none the name of one already there), and `apply-placement.sh` that says what the set holds and cannot
    express, the node labels to set by hand (commented: gpuscope cannot name the nodes), then
    applies the ConfigMaps and the patches."""
    said = [
        f"# gpuscope rightsize: the winning placement of the report of {timestamp(report.end)}",
        *(f"# Holds: {comment_text(line)}" for line in placement.contains),
        *(f"# Cannot express: {comment_text(line)}" for line in placement.cannot),
    ]
    script = [
        "#!/bin/sh",
        *said,
        "# Review it, label the nodes, then run it (sh apply-placement.sh). It replaces the",
        "# per-workload patches of apply.sh for the workloads it moves: run one or the other.",
        "set -eu",
        'cd "$(dirname "$0")"',
    ]
    if placement.nodes:
        script += ["", "# First, by hand, on the nodes to use (gpuscope cannot name them):"]
    for step in placement.nodes:
        command = shlex.join(["kubectl", *_context(step.cluster), *step.command])
        script += [f"# {comment_text(step.heading)}:", f"#   {comment_text(command)}"]
    for manifest in placement.manifests:
        name = _unique(f"{PLACEMENT}{manifest.file}", files)
        command = shlex.join(
            ["kubectl", *_context(manifest.cluster), "apply", f"--filename={name}"]
        )
        files[name] = "\n".join(
            [
                MARK,
                *(f"# {comment_text(line)}" for line in manifest.heading),
                f"# Apply: {comment_text(command)}",
                yaml.dump(manifest.body, Dumper=_Blocks, sort_keys=False, allow_unicode=True),
            ]
        )
        script += ["", *(f"# {comment_text(line)}" for line in manifest.heading), command]
    for patch in placement.patches:
        heading = [
            comment_text(line)
            for line in (
                f"{patch.namespace}/{patch.name} ({patch.kind}) in the {placement.policy} placement",
                *patch.changes,
                *((f"Note: {patch.note}",) if patch.note else ()),
            )
        ]
        script += ["", *(f"# {line}" for line in heading)]
        if patch.body is None:
            script.append("# (no patch: change it by hand, as said above)")
            continue
        name = _unique(f"{PLACEMENT}{patch.file}", files)
        command = shlex.join(patch.command(name))
        files[name] = "\n".join(
            [
                MARK,
                *said[1:],
                *(f"# {line}" for line in heading),
                f"# Apply: {comment_text(command)}",
                yaml.safe_dump(patch.body, sort_keys=False, allow_unicode=True),
            ]
        )
        script.append(command if patch.live else f"# {comment_text(command)}")
    files[PLACEMENT_SCRIPT] = "\n".join(script) + "\n"


class _Blocks(yaml.SafeDumper):
    """Safe YAML with text of several lines as a literal block: a ConfigMap's config file reads
    as the file it is, not as one escaped line."""


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    )


_Blocks.add_representer(str, _block)


def _context(cluster: str) -> list[str]:
    return [f"--context={cluster}"] if cluster else []


def _unique(name: str, taken: dict[str, str]) -> str:
    stem, number = name.removesuffix(".yaml"), 2
    while name in taken or name in {SCRIPT, PLACEMENT_SCRIPT}:
        name = f"{stem}-{number}.yaml"
        number += 1
    return name
