"""Fleet files (`exporter.simulator.fleet`): every fixture loads as before, every field's bad
values are refused with one line naming the key path, and whatever the input — binary, an alias
bomb, /dev/urandom, 50 MB values, random structures — the answer is a Fleet or a FleetError, and
`gpuscope serve --simulate FILE` exits 2 with one line, at once, in bounded memory."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import documents
from exporter.simulator import fleet as fleet_module
from exporter.simulator.fleet import Fleet, FleetError, fleet_from_document, load_fleet, parse_fleet
from exporter.simulator.fleet_values import parse_bytes
from tests.helpers import FLEETS, ROOT, Measured, daemon_command, run_measured
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.timeout(60)

BOUNDED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EXIT_WITHIN = 10.0
"""Seconds `serve` may take to refuse a fleet file: starting Python is most of it."""
MAX_RSS = 80 * 2**20
"""The daemon's peak memory when it refuses a file: its imports (about 47 MiB), never the file's
contents (a 50 MB value read whole would pass it)."""

BASE: dict[str, Any] = {
    "seed": 7,
    "driver_version": "570.133.20",
    "cuda_version": "12.8",
    "gpus": [
        {"model": "h100-sxm", "count": 2, "cooling": "normal", "sharing": "time-slicing"},
        {"model": "h100-sxm", "mig": ["3g.40gb", "2g.20gb"]},
    ],
    "processes": [
        {
            "pid": 10,
            "gpu": 0,
            "memory": "10GiB",
            "pattern": "bursty",
            "level": 0.5,
            "period": "20s",
            "duty": 0.3,
            "memory_intensity": 0.4,
            "tensor_intensity": 0.5,
            "start": "1s",
            "stop": "5m",
            "pod": "lab/notebook",
            "container": "main",
        },
        {"pid": 11, "gpu": 2, "mig_instance": 0, "memory": "10GiB"},
    ],
    "faults": [
        {"kind": "gpu_lost", "gpu": 1, "at": "30s", "until": "90s", "error": "gpu_is_lost"},
        {"kind": "error", "function": "nvmlDeviceGetPowerUsage", "error": "not_supported"},
        {"kind": "init_error", "error": "driver_not_loaded", "until": "5s"},
        {"kind": "ecc", "gpu": 0, "corrected": 3, "uncorrected": 1},
        {"kind": "xid", "gpu": 0, "xid": 79},
        {"kind": "mig_layout", "gpu": 2, "at": "2m", "mig": ["7g.80gb"]},
        {"kind": "hang", "gpu": 1, "at": "5m"},
        {"kind": "exception", "function": "nvmlDeviceGetPowerUsage", "exception": "TypeError"},
    ],
    "pods": [
        {
            "name": "notebook",
            "namespace": "lab",
            "workload": {"kind": "StatefulSet", "name": "nb"},
            "labels": {"team": "ml", "app.kubernetes.io/name": ""},
            "containers": ["main", "sidecar"],
            "gpus": [0, {"gpu": 2, "mig_instance": 1}],
            "resource": "nvidia.com/gpu",
            "shared": True,
        }
    ],
}
"""A fleet using every key; the bad values below are each one change to it."""

DELETE = object()
LONG = "<50 MB>"
"""Stands for a 50 MB string, made only while its test runs."""
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def changed(document: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A deep copy of `document` with `value` at `path` (`gpus[0].model`), or the key deleted."""
    result = copy.deepcopy(document)
    steps: list[str | int] = [name if name else int(index) for name, index in _STEP.findall(path)]
    parent: Any = result
    for step in steps[:-1]:
        parent = parent[step]
    last = steps[-1]
    if value is DELETE:
        del parent[last]
    elif isinstance(parent, list) and last == len(parent):
        parent.append(value)
    else:
        parent[last] = value
    return result


def _grown(value: object) -> object:
    """`value` with `LONG`, as itself or as a key, made a 50 MB string."""
    huge = "x" * 50_000_000
    if isinstance(value, dict):
        return {huge if key == LONG else key: item for key, item in value.items()}
    return huge if value == LONG else value


def refusal(document: object) -> str:
    with pytest.raises(FleetError) as caught:
        parse_fleet(document)
    message = str(caught.value)
    assert "\n" not in message
    assert len(message) <= documents.MAX_MESSAGE
    return message


# -- what loads ---------------------------------------------------------------------------------


def test_every_fixture_and_example_fleet_loads() -> None:
    fleets = sorted(FLEETS.glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))
    assert len(fleets) >= 6
    for path in fleets:
        assert load_fleet(path).gpus, path


def test_the_example_fleet_reads_as_documented() -> None:
    fleet = load_fleet(ROOT / "examples" / "fleet.yaml")
    assert (fleet.seed, fleet.driver_version, fleet.cuda_version) == (42, "570.133.20", 12080)
    assert [gpu.model.key for gpu in fleet.gpus] == [
        "h100-sxm",
        "h100-sxm",
        "a100-sxm4-80gb",
        "l4",
        "h100-sxm",
    ]
    assert fleet.gpus[3].cooling == "poor"
    assert [p.profile for p in fleet.gpus[4].mig or ()] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    starved = next(p for p in fleet.processes if p.pid == 4401)
    assert (starved.pattern, starved.level, starved.period, starved.duty) == (
        "input_starved",
        0.95,
        2.0,
        0.3,
    )
    assert starved.memory_bytes == 19 * 2**30
    assert [fault.kind for fault in fleet.faults] == [
        "xid",
        "xid",
        "gpu_lost",
        "mig_layout",
        "hang",
    ]
    assert fleet.faults[2].error == pynvml.NVML_ERROR_GPU_IS_LOST
    assert (fleet.faults[2].at, fleet.faults[2].until) == (120.0, 180.0)
    chat = next(pod for pod in fleet.pods if pod.name == "chat-api-6b9f7c5d4-7xq2m")
    assert (chat.workload_kind, chat.workload, chat.shared) == ("Deployment", "chat-api", True)
    assert chat.labels == (("team", "apps"),)


def test_the_fleet_that_uses_every_key_parses() -> None:
    fleet = parse_fleet(BASE)
    assert len(fleet.gpus) == 3
    assert fleet.faults[1].error == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert fleet.faults[7].exception == "TypeError"
    assert fleet.pods[0].devices[1].mig_instance == 1
    assert fleet.pods[0].labels == (("app.kubernetes.io/name", ""), ("team", "ml"))


def test_the_documented_fleet_parses() -> None:
    doc = fleet_module.__doc__ or ""
    example = doc.split("A fleet file (every key but `gpus` optional):", 1)[1].split(
        "Times are", 1
    )[0]
    parsed = parse_fleet(yaml.safe_load(example))
    assert len(parsed.gpus) == 3
    assert parsed.gpus[2].mig is not None
    assert len(parsed.faults) == 8


def test_the_simulator_guides_fleet_parses() -> None:
    section = (ROOT / "docs" / "guide" / "simulator.md").read_text()
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    parsed = parse_fleet(yaml.safe_load(example))
    assert len(parsed.gpus) == 3
    assert len(parsed.faults) == 8


@pytest.mark.parametrize(
    ("path", "value", "read", "expected"),
    [
        (
            "processes[0].pattern",
            "input-starved",
            lambda f: f.processes[0].pattern,
            "input_starved",
        ),
        ("faults[0].kind", "gpu-lost", lambda f: f.faults[0].kind, "gpu_lost"),
        (
            "faults[1].error",
            "NOT_SUPPORTED",
            lambda f: f.faults[1].error,
            pynvml.NVML_ERROR_NOT_SUPPORTED,
        ),
        ("processes[0].memory", 512, lambda f: f.processes[0].memory_bytes, 512),
        ("faults", None, lambda f: f.faults, ()),
        ("pods[0].workload", None, lambda f: f.pods[0].workload_kind, "Pod"),
    ],
)
def test_spellings_that_always_worked_still_do(
    path: str, value: object, read: Callable[[Fleet], object], expected: object
) -> None:
    assert read(parse_fleet(changed(BASE, path, value))) == expected


@pytest.mark.parametrize(
    ("spelled", "size"),
    [(512, 512), ("512MiB", 512 * 2**20), ("20GiB", 20 * 2**30), ("1.5GB", 1_500_000_000)],
)
def test_sizes(spelled: object, size: int) -> None:
    assert parse_bytes(spelled) == size


@pytest.mark.parametrize("spelled", [-1, "lots", "12 parsecs", "9" * 400 + "GiB"])
def test_sizes_refused(spelled: object) -> None:
    with pytest.raises(ValueError, match=r"negative|not a size|too large"):
        parse_bytes(spelled)


# -- what is refused, and how it is said --------------------------------------------------------

_H100 = "H100 SXM"
BAD_VALUES: list[tuple[dict[str, object], str]] = [
    # the document
    ({"gpus": DELETE}, "missing field gpus"),
    ({"colour": "green"}, "unknown field 'colour'"),
    ({"seed": -1}, "seed: -1 is outside 0..4294967295"),
    ({"seed": "7"}, "seed: expected a whole number, got a string"),
    (
        {"driver_version": 570.1},
        'driver_version: 570.1 is a number to YAML: write it quoted ("570.133.20")',
    ),
    ({"driver_version": "latest"}, "driver_version: 'latest' is not a version such as 570.133.20"),
    ({"cuda_version": 12.8}, 'cuda_version: 12.8 is a number to YAML: write it quoted ("12.8")'),
    ({"cuda_version": "twelve"}, "cuda_version: 'twelve' is not a version such as 12.8"),
    ({"gpus": []}, "gpus: expected at least 1 entry"),
    ({"gpus": {"model": "l4"}}, "gpus: expected a list, got a mapping"),
    ({"processes": "none"}, "processes: expected a list, got a string"),
    ({"faults": {}}, "faults: expected a list, got a mapping"),
    ({"pods": 3}, "pods: expected a list, got a number"),
    # gpus
    ({"gpus[0]": "h100"}, "gpus[0]: expected a mapping, got a string"),
    ({"gpus[0].colour": "green"}, "gpus[0]: unknown field 'colour'"),
    ({"gpus[0].model": "rtx-9999"}, "gpus[0].model: unknown GPU model 'rtx-9999' (known: v100"),
    ({"gpus[0].model": 7}, "gpus[0].model: expected a string, got a number"),
    ({"gpus[0].count": 0}, "gpus[0].count: 0 is outside 1..64"),
    ({"gpus[0].count": 2.0}, "gpus[0].count: expected a whole number, got 2.0"),
    ({"gpus[0].count": True}, "gpus[0].count: expected a whole number, got true/false"),
    ({"gpus[0].count": 64}, "gpus[1].count: makes 65 GPUs; at most 64 per node"),
    ({"gpus[0].cooling": "lava"}, "gpus[0].cooling: 'lava' is not one of normal, poor"),
    ({"gpus[0].sharing": "mig"}, "gpus[0].sharing: 'mig' is not one of time-slicing, mps"),
    ({"gpus[1].mig": "3g.40gb"}, "gpus[1].mig: expected a list, got a string"),
    ({"gpus[1].mig": ["1g.10gb"] * 8}, "gpus[1].mig: more than 7 entries"),
    (
        {"gpus[1].mig": ["5g.50gb"]},
        f"gpus[1].mig[0]: '5g.50gb' is not a MIG profile of a {_H100} (1g.10gb, 1g.20gb",
    ),
    ({"gpus[1].mig": [3]}, "gpus[1].mig[0]: expected a string, got a number"),
    (
        {"gpus[1].mig": ["4g.40gb", "4g.40gb"]},
        f"gpus[1].mig[1]: a {_H100} holds at most 1 4g.40gb",
    ),
    (
        {"gpus[1].mig": ["3g.40gb", "3g.40gb", "1g.10gb", "1g.10gb"]},
        "gpus[1].mig: the instances need 8/7 compute and 10/8 memory slices; they do not fit",
    ),
    ({"gpus[0].model": "l4", "gpus[0].mig": ["1g.10gb"]}, "gpus[0].mig: a L4 has no MIG mode"),
    # processes
    ({"processes[0]": "x"}, "processes[0]: expected a mapping, got a string"),
    ({"processes[0].colour": 1}, "processes[0]: unknown field 'colour'"),
    ({"processes[0].pid": DELETE}, "processes[0]: missing field pid"),
    ({"processes[0].gpu": DELETE}, "processes[0]: missing field gpu"),
    ({"processes[0].pid": 0}, "processes[0].pid: 0 is outside 1..4194303"),
    ({"processes[0].pid": "10"}, "processes[0].pid: expected a whole number, got a string"),
    ({"processes[0].pid": 11}, "processes[1].pid: 11 appears more than once (also processes[0])"),
    ({"processes[0].gpu": 9}, "processes[0].gpu: 9 is not a GPU index from 0 to 2"),
    ({"processes[0].gpu": -1}, "processes[0].gpu: -1 is not a GPU index from 0 to 2"),
    ({"processes[0].gpu": None}, "processes[0].gpu: expected a whole number, got null"),
    (
        {"processes[0].memory": "lots"},
        "processes[0].memory: 'lots' is not a size (e.g. 512MiB, 20GiB, 1.5GB)",
    ),
    ({"processes[0].memory": -1}, "processes[0].memory: -1 is outside 0.."),
    (
        {"processes[0].memory": 1.5},
        "processes[0].memory: expected a size such as 20GiB, or bytes, got 1.5",
    ),
    (
        {"processes[0].memory": "90GiB"},
        f"processes: processes on GPU 0 need 90.0 GiB, more than a {_H100} has (79.6 GiB)",
    ),
    (
        {"processes[1].memory": "50GiB"},
        "processes[1].memory: 50.0 GiB does not fit a 3g.40gb instance",
    ),
    (
        {"processes[0].pattern": "chaotic"},
        (
            "processes[0].pattern: 'chaotic' is not one of idle, steady, bursty, sawtooth, "
            "input_starved"
        ),
    ),
    ({"processes[0].level": 1.5}, "processes[0].level: 1.5 is above 1"),
    ({"processes[0].level": "high"}, "processes[0].level: expected a number, got a string"),
    ({"processes[0].level": float("nan")}, "processes[0].level: must be a finite number"),
    ({"processes[0].duty": -0.1}, "processes[0].duty: -0.1 is below 0"),
    (
        {"processes[0].memory_intensity": True},
        "processes[0].memory_intensity: expected a number, got true/false",
    ),
    ({"processes[0].tensor_intensity": 2}, "processes[0].tensor_intensity: 2 is above 1"),
    ({"processes[0].period": "0s"}, "processes[0].period: must be longer than 0s"),
    (
        {"processes[0].period": 20},
        "processes[0].period: '20' is not a duration (missing unit?); use e.g. 500ms",
    ),
    ({"processes[0].period": "soon"}, "processes[0].period: 'soon' is not a duration"),
    ({"processes[0].start": "10m"}, "processes[0].stop: must come after start"),
    (
        {"processes[0].stop": "1h1d"},
        "processes[0].stop: '1h1d': units must go from largest to smallest",
    ),
    (
        {"processes[1].mig_instance": -1},
        "processes[1].mig_instance: -1 is not an instance position (0, 1, ...)",
    ),
    (
        {"processes[1].mig_instance": 5},
        "processes[1].mig_instance: 5 is not an instance of GPU 2 (it has 2)",
    ),
    ({"processes[0].mig_instance": 0}, "processes[0].mig_instance: GPU 0 is not in MIG mode"),
    (
        {"processes[1].mig_instance": DELETE},
        "processes[1]: GPU 2 is in MIG mode: give the process a mig_instance",
    ),
    ({"processes[0].pod": "notebook"}, "processes[0].pod: 'notebook' is not namespace/name"),
    ({"processes[0].pod": "lab/Note_Book"}, "processes[0].pod: 'Note_Book' is not a Kubernetes"),
    ({"processes[0].pod": "x/none"}, "processes[0].pod: no pod x/none in pods"),
    (
        {"processes[0].container": "gone"},
        "processes[0].container: lab/notebook has no container 'gone' (it has main, sidecar)",
    ),
    ({"processes[1].container": "main"}, "processes[1].container: needs a pod"),
    # faults
    ({"faults[0]": "x"}, "faults[0]: expected a mapping, got a string"),
    ({"faults[0].colour": 1}, "faults[0]: unknown field 'colour'"),
    ({"faults[0].kind": DELETE}, "faults[0]: missing field kind"),
    ({"faults[0].kind": "meteor"}, "faults[0].kind: 'meteor' is not one of gpu_lost, error"),
    ({"faults[0].at": "later"}, "faults[0].at: 'later' is not a duration"),
    ({"faults[0].until": "10s"}, "faults[0].until: must come after at"),
    ({"faults[0].gpu": DELETE}, "faults[0].gpu: missing: the GPU it happens to"),
    ({"faults[0].gpu": 3}, "faults[0].gpu: 3 is not a GPU index from 0 to 2"),
    (
        {"faults[0].error": "oops"},
        "faults[0].error: 'oops' is not an NVML error name (e.g. not_supported, unknown)",
    ),
    ({"faults[0].error": 5}, "faults[0].error: expected a string, got a number"),
    ({"faults[1].function": DELETE}, "faults[1].function: missing: the NVML function it acts on"),
    (
        {"faults[1].function": "nvmlDeviceGetWarpDrive"},
        "faults[1].function: 'nvmlDeviceGetWarpDrive' is not an NVML function the simulator",
    ),
    (
        {"faults[2].gpu": 0},
        (
            "faults[2].gpu: only faults of kind gpu_lost, error, ecc, xid, mig_layout, hang or "
            "exception take it, not init_error"
        ),
    ),
    ({"faults[3].corrected": -1}, "faults[3].corrected: -1 is outside 0..4294967295"),
    ({"faults[3].uncorrected": "1"}, "faults[3].uncorrected: expected a whole number, got a"),
    ({"faults[0].corrected": 1}, "faults[0].corrected: only faults of kind ecc take it, not"),
    ({"faults[4].xid": DELETE}, "faults[4].xid: an XID number (e.g. 79) is needed"),
    ({"faults[4].xid": 0}, "faults[4].xid: 0 is outside 1..4294967295"),
    ({"faults[0].xid": 79}, "faults[0].xid: only faults of kind xid take it, not gpu_lost"),
    ({"faults[5].mig": ["9g.1gb"]}, "faults[5].mig[0]: '9g.1gb' is not a MIG profile of a"),
    ({"faults[5].gpu": 0}, "faults[5].gpu: GPU 0 is not in MIG mode (give it a mig layout)"),
    ({"faults[5].mig": DELETE}, "faults[5].mig: missing: the GPU's new MIG layout"),
    ({"faults[3].mig": []}, "faults[3].mig: only faults of kind mig_layout take it, not ecc"),
    (
        {"faults[6].gpu": DELETE},
        "faults[6]: a hang fault needs the gpu whose calls hang, the function, or both",
    ),
    (
        {"faults[7].exception": "SystemExit"},
        "faults[7].exception: 'SystemExit' is not one of RuntimeError, TypeError",
    ),
    ({"faults[7].exception": ""}, "faults[7].exception: '' is not one of RuntimeError"),
    (
        {"faults[1].exception": "TypeError"},
        "faults[1].exception: only faults of kind exception take it, not error",
    ),
    # pods
    ({"pods[0]": []}, "pods[0]: expected a mapping, got a list"),
    ({"pods[0].colour": 1}, "pods[0]: unknown field 'colour'"),
    ({"pods[0].name": DELETE}, "pods[0]: missing field name"),
    ({"pods[0].name": "Bad_Name"}, "pods[0].name: 'Bad_Name' is not a Kubernetes name"),
    ({"pods[0].name": 7}, "pods[0].name: expected a string, got a number"),
    ({"pods[0].namespace": ""}, "pods[0].namespace: must not be empty"),
    ({"pods[1]": {"name": "notebook", "namespace": "lab"}}, "pods[1]: lab/notebook appears more"),
    ({"pods[0].workload": "Deployment"}, "pods[0].workload: expected a mapping, got a string"),
    (
        {"pods[0].workload.kind": "Rollout"},
        "pods[0].workload.kind: 'Rollout' is not one of Pod, Deployment, StatefulSet",
    ),
    ({"pods[0].workload.replicas": 3}, "pods[0].workload: unknown field 'replicas'"),
    ({"pods[0].workload.name": "A"}, "pods[0].workload.name: 'A' is not a Kubernetes name"),
    ({"pods[0].labels": ["team"]}, "pods[0].labels: expected a mapping, got a list"),
    ({"pods[0].labels.team": 3}, "pods[0].labels.team: expected a string, got a number"),
    (
        {"pods[0].labels.team": "a b"},
        "pods[0].labels.team: 'a b' is not a Kubernetes label value",
    ),
    ({"pods[0].labels.bad key": "x"}, "pods[0].labels: 'bad key' is not a Kubernetes label name"),
    ({"pods[0].containers": []}, "pods[0].containers: expected at least 1 entry"),
    (
        {"pods[0].containers[1]": "Not OK"},
        "pods[0].containers[1]: 'Not OK' is not a Kubernetes name",
    ),
    ({"pods[0].gpus[0]": 5}, "pods[0].gpus[0]: 5 is not a GPU index from 0 to 2"),
    ({"pods[0].gpus[0]": "0"}, "pods[0].gpus[0]: expected a whole number, got a string"),
    (
        {"pods[0].gpus[0]": {"gpu": 0, "mig_instance": 0}},
        "pods[0].gpus[0].mig_instance: GPU 0 has no MIG instance 0",
    ),
    ({"pods[0].gpus[1].gpu": DELETE}, "pods[0].gpus[1]: missing field gpu"),
    (
        {"pods[0].resource": "gpu"},
        "pods[0].resource: 'gpu' is not a resource name such as nvidia.com/gpu",
    ),
    ({"pods[0].shared": "yes"}, "pods[0].shared: expected true or false, got 'yes'"),
    # values too long to quote whole
    ({"gpus[0].model": LONG}, "gpus[0].model: longer than 64 characters"),
    (
        {"gpus[0].cooling": LONG},
        (
            "gpus[0].cooling: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'… "
            "(50,000,000 characters) is not one of normal, poor"
        ),
    ),
    ({"processes[0].pod": LONG}, "processes[0].pod: longer than 507 characters"),
    ({"pods[0].labels": {LONG: "v"}}, "pods[0].labels: longer than 316 characters"),
]


@pytest.mark.parametrize(
    ("changes", "message"),
    BAD_VALUES,
    ids=[", ".join(changes)[:60] + f"-{n}" for n, (changes, _) in enumerate(BAD_VALUES)],
)
def test_bad_values_are_refused_naming_the_key_path(
    changes: dict[str, object], message: str
) -> None:
    document = BASE
    for path, value in changes.items():
        document = changed(document, path, _grown(value))
    assert refusal(document).startswith(f"fleet: {message}")


def test_a_document_that_is_not_a_mapping_is_refused() -> None:
    assert refusal([]) == "fleet: expected a mapping, got a list"
    assert refusal(None) == "fleet: expected a mapping, got null"


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [\n")
    with pytest.raises(FleetError, match=r"^--simulate .*broken\.yaml: not valid YAML at line 2"):
        load_fleet(broken)
    with pytest.raises(FleetError, match=r"^--simulate .*absent\.yaml: cannot read it: No such"):
        load_fleet(tmp_path / "absent.yaml")


# -- gpuscope serve --simulate FILE: one line, exit 2, at once, bounded memory -------------------


def serve(fleet: Path) -> Measured:
    """`gpuscope serve --simulate FLEET` until it exits (killed after `EXIT_WITHIN` seconds)."""
    command = daemon_command("--web.listen-address=127.0.0.1:0", f"--simulate={fleet}")
    return run_measured(command, timeout=EXIT_WITHIN)


def _write(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_bytes(content)
    return path


def _sparse(tmp_path: Path) -> Path:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as file:
        file.truncate(8 * 2**30)  # 8 GiB that take no disk
    return path


HOSTILE_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "binary": (
        lambda tmp: _write(tmp, bytes(range(256)) * 4),
        "--simulate {path}: not UTF-8 text (byte 128 is 0x80)",
    ),
    "nul byte": (
        lambda tmp: _write(tmp, b"gpus: [{model: l4}]\n\x00\n"),
        "--simulate {path}: not valid YAML",
    ),
    "unknown value": (
        lambda tmp: _write(tmp, b"gpus:\n  - {model: l4, cooling: lava}\n"),
        "--simulate {path}: gpus[0].cooling: 'lava' is not one of normal, poor",
    ),
    "alias bomb": (
        lambda tmp: _write(tmp, alias_bomb().encode()),
        "--simulate {path}: expands to more than 100,000 values",
    ),
    "duplicate key": (
        lambda tmp: _write(tmp, b"gpus: [{model: l4}]\ngpus: [{model: t4}]\n"),
        "--simulate {path}: key 'gpus' appears twice in one mapping (line 2)",
    ),
    "oversized": (_sparse, "--simulate {path}: larger than 1 MiB (the limit)"),
    "/dev/urandom": (
        lambda tmp: Path("/dev/urandom"),
        "invalid --simulate: '{path}' is neither a GPU count nor a readable fleet file",
    ),
    "deep nesting": (
        lambda tmp: _write(tmp, b"gpus: " + b"[" * 100 + b"]" * 100 + b"\n"),
        "--simulate {path}: nested more than 64 levels deep",
    ),
    "very deep nesting": (
        lambda tmp: _write(tmp, b"gpus: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
        "--simulate {path}: not valid YAML at line 1: exceeded maximum nesting depth",
    ),
    "50 MB value": (
        lambda tmp: _write(tmp, b"gpus: [{model: " + b"x" * 50_000_000 + b"}]\n"),
        "--simulate {path}: larger than 1 MiB (the limit)",
    ),
    "a directory": (
        lambda tmp: tmp,
        "invalid --simulate: '{path}' is neither a GPU count nor a readable fleet file",
    ),
}
"""What `serve` is given, and the line it answers with after `gpuscope: error: `."""


@pytest.mark.slow
@pytest.mark.parametrize("case", list(HOSTILE_FILES))
def test_serve_refuses_a_hostile_fleet_file_with_one_line(case: str, tmp_path: Path) -> None:
    make, expected = HOSTILE_FILES[case]
    fleet = make(tmp_path)
    result = serve(fleet)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, lines
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("gpuscope: error: " + expected.format(path=fleet)), line
    assert len(line) < 300
    assert result.seconds < EXIT_WITHIN
    assert result.peak_rss_bytes < MAX_RSS, f"{result.peak_rss_bytes / 2**20:.0f} MiB"


# -- whatever the input: a Fleet or a FleetError ------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["0", "1s", "20GiB", "h100-sxm", "3g.40gb", "xid", "lab/notebook", "-1"]),
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: object, prefix: str = "") -> list[str]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, f"{prefix}.{key}" if prefix else key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, f"{prefix}[{index}]"))
    return found


PATHS = [path for path in _paths(BASE) if "app.kubernetes.io" not in path]


def _answer(load: Any) -> None:
    """`load()` gives a Fleet, or a FleetError of one short line; anything else fails."""
    try:
        assert isinstance(load(), Fleet)
    except FleetError as error:
        message = str(error)
    else:
        return
    assert "\n" not in message
    assert len(message) <= documents.MAX_MESSAGE


@BOUNDED
@given(st.lists(st.tuples(st.sampled_from(PATHS), JSONISH | st.just(DELETE)), max_size=3))
def test_any_change_to_a_fleet_gives_a_fleet_or_a_fleet_error(
    changes: list[tuple[str, object]],
) -> None:
    document = BASE
    for path, value in changes:
        try:
            document = changed(document, path, value)
        except (KeyError, IndexError, TypeError, AttributeError):
            continue  # an earlier change removed or replaced what this path went through
    _answer(lambda: parse_fleet(document))
    if DELETE not in [value for _, value in changes]:
        text = yaml.safe_dump(document)
        _answer(lambda: documents.load_text(text, fleet_from_document, FleetError, source="f"))


@BOUNDED
@given(
    st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300),
        st.builds(
            lambda head, tail: head + tail,
            st.sampled_from(["gpus:\n  - ", "gpus: [{model: l4}]\nprocesses:\n  - ", "faults: "]),
            st.text(alphabet="{}[]:,&*!- \n'\"abcgpu019", max_size=80),
        ),
    )
)
def test_any_text_gives_a_fleet_or_a_fleet_error(data: str | bytes) -> None:
    _answer(lambda: documents.load_text(data, fleet_from_document, FleetError, source="f"))
