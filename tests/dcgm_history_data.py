"""A week of dcgm-exporter and kube-state-metrics history whose right answers are known, as
OpenMetrics for promtool backfill: what a cluster that never ran gpuscope has in Prometheus.

The same workloads run four times, once per way dcgm-exporter's series can look — 4.8's names
(`DCGM_FI_DEV_GPU_UTIL` in %, `DCGM_FI_DEV_FB_USED` in MiB, `Hostname`) or 4.9's
(`DCGM_FI_DEV_GPU_UTIL_RATIO` 0-1, `DCGM_FI_DEV_FB_USED_BYTES`, `hostname`), each with the pod
labels as the exporter wrote them or renamed `exported_*` by a scrape that kept the target's own
(then every series carries the exporter's pod as `namespace`/`pod`) — each in namespaces of its
own (`research-48-plain`, ...). Known answers: `notebook` holds a GPU and never uses it (release),
`chat` uses a tenth of an A100 (a MIG slice), `pretrain` keeps an H100 busy (keep), `finetune`
is a 2-GPU Job whose second GPU idles all week (1 GPU), and in 4.8's plain form `tts` and `asr`
time-slice one GPU, each shown the whole device's values (per-process data missing).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.helpers import require_tool
from tests.synthetic_history import backfill

if TYPE_CHECKING:
    from pathlib import Path
    from typing import TextIO

DAY = 86400.0
END = 1_790_000_000.0
GIB = 1024**3
MIB = 1024**2
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
FORMS = ("48-plain", "48-exported", "49-plain", "49-exported")
EXPORTER = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p", "job": "dcgm"}
"""The labels a scrape that keeps the target's own puts on every series of the exporter."""


@dataclass(frozen=True)
class Holder:
    """A workload's pods and what each of their GPUs did: (utilization 0-1, memory GiB) per GPU."""

    name: str
    kind: str
    model: str
    gpus: tuple[tuple[float, float], ...]
    pods: int = 1
    shares: str | None = None
    """Another holder's name: this one time-slices that holder's GPU."""

    def pod(self, index: int) -> str:
        return (
            f"{self.name}-{index}"
            if self.kind != "Deployment"
            else f"{self.name}-5d8c7-{index:05d}"
        )


HOLDERS = (
    Holder("notebook", "StatefulSet", H100, ((0.0, 0.0),)),
    Holder("chat", "Deployment", A100, ((0.10, 6.0),)),
    Holder("pretrain", "Job", H100, ((0.97, 74.0),)),
    Holder("finetune", "Job", H100, ((0.70, 60.0), (0.0, 0.0))),
)
SHARED = (
    Holder("tts", "Deployment", A100, ((0.12, 8.0),)),
    Holder("asr", "Deployment", A100, ((0.12, 8.0),), shares="tts"),
)
"""Only in 4.8's plain form: two pods time-slicing one GPU, as KUBERNETES_VIRTUAL_GPUS before
4.8.2 wrote it (the device's values copied onto each pod, a `vgpu` label apart)."""
ANSWERS = {
    "notebook": ("idle", "release"),
    "pretrain": ("compute-bound", "H100 SXM"),
    "finetune": ("underused", "H100 SXM x1"),
}


def holders(form: str) -> tuple[Holder, ...]:
    return HOLDERS + SHARED if form == "48-plain" else HOLDERS


def namespace(form: str) -> str:
    return f"ml-{form}"


def uuid(form: str, holder: Holder, pod: int, gpu: int) -> str:
    digest = zlib.crc32(f"{form}/{holder.shares or holder.name}".encode())
    return f"GPU-{digest:08x}-{pod}-{gpu}"


def write_openmetrics(
    out: TextIO, *, end: float = END, days: float = 7.5, interval: float = 120
) -> None:
    """Every family, each together, then `# EOF`."""
    times = [end - i * interval for i in range(int(days * DAY / interval), -1, -1)]
    families: dict[str, list[str]] = {}
    rng = random.Random(7)

    def add(name: str, labels: dict[str, str], values: list[float]) -> None:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        families.setdefault(name, []).extend(
            f"{name}{{{inner}}} {value:.6g} {t:.0f}\n"
            for t, value in zip(times, values, strict=True)
        )

    def wave(level: float, spread: float) -> list[float]:
        return [min(max(level + spread * (2 * rng.random() - 1), 0.0), 1.0) for _ in times]

    ones = [1.0] * len(times)
    owned: set[tuple[str, str]] = set()

    def cluster_state(ns: str, holder: Holder, pod: str) -> None:
        """kube-state-metrics' series of one pod: its owner chain, its node, its GPU request."""
        owner = (holder.kind, holder.name)
        if holder.kind == "Deployment":
            owner = ("ReplicaSet", holder.pod(0).rsplit("-", 1)[0])
            if (ns, owner[1]) not in owned:
                owned.add((ns, owner[1]))
                add(
                    "kube_replicaset_owner",
                    {
                        "namespace": ns,
                        "replicaset": owner[1],
                        "owner_kind": "Deployment",
                        "owner_name": holder.name,
                        "owner_is_controller": "true",
                        "job": "kube-state-metrics",
                    },
                    ones,
                )
        add(
            "kube_pod_owner",
            _ksm(ns, pod, owner_kind=owner[0], owner_name=owner[1], owner_is_controller="true"),
            ones,
        )
        add(
            "kube_pod_info",
            _ksm(ns, pod, node="gpu-node", created_by_kind=owner[0], created_by_name=owner[1]),
            ones,
        )
        add(
            "kube_pod_container_resource_requests",
            _ksm(ns, pod, container="main", resource="nvidia_com_gpu", unit="integer"),
            [float(len(holder.gpus))] * len(times),
        )

    for form in FORMS:
        version, labelling = form.split("-")
        node = f"gpu-node-{form}"
        host = {"Hostname" if version == "48" else "hostname": node}
        util, util_scale = (
            ("DCGM_FI_DEV_GPU_UTIL", 100.0)
            if version == "48"
            else ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.0)
        )
        memory, memory_scale = (
            ("DCGM_FI_DEV_FB_USED", GIB / MIB)
            if version == "48"
            else ("DCGM_FI_DEV_FB_USED_BYTES", GIB)
        )
        free = "DCGM_FI_DEV_FB_FREE" if version == "48" else "DCGM_FI_DEV_FB_FREE_BYTES"
        ns = namespace(form)
        index = 0
        seen: dict[str, tuple[list[float], list[float]]] = {}
        for holder in holders(form):
            for pod in range(holder.pods):
                pod_name = holder.pod(pod)
                cluster_state(ns, holder, pod_name)
                for gpu, (busy, gib) in enumerate(holder.gpus):
                    device = uuid(form, holder, pod, gpu)
                    if device not in seen:
                        seen[device] = (
                            wave(busy, 0.02 if busy else 0.0),
                            wave(gib / 80, 0.002 if gib else 0.0),
                        )
                        index += 1
                    used, held = seen[device]
                    labels = {
                        "gpu": str(index - 1),
                        "UUID": device,
                        "pci_bus_id": f"00000000:{index:02X}:00.0",
                        "device": f"nvidia{index - 1}",
                        "modelName": holder.model,
                        **host,
                    }
                    owner = {"namespace": ns, "pod": pod_name, "container": "main"}
                    if labelling == "exported":
                        labels |= {f"exported_{k}": v for k, v in owner.items()} | EXPORTER
                    else:
                        labels |= owner | {"job": "dcgm"}
                    if holder.shares or any(h.shares == holder.name for h in holders(form)):
                        labels["vgpu"] = "1" if holder.shares else "0"
                    add(util, labels, [u * util_scale for u in used])
                    add(memory, labels, [m * 80 * memory_scale for m in held])
                    add(free, labels, [(1 - m) * 80 * memory_scale for m in held])
        # A GPU nobody holds: no pod labels of its own (the exporter's, in the exported form).
        idle = {"gpu": "7", "UUID": f"GPU-unheld-{form}", "modelName": H100, **host}
        idle |= EXPORTER if labelling == "exported" else {"job": "dcgm"}
        add(util, idle, [0.0] * len(times))
        add(memory, idle, [0.0] * len(times))
    # The exporter's own pod, as kube-state-metrics sees it: it asks for no GPU.
    add(
        "kube_pod_info",
        _ksm(
            EXPORTER["namespace"],
            EXPORTER["pod"],
            created_by_kind="DaemonSet",
            created_by_name="nvidia-dcgm-exporter",
        ),
        ones,
    )
    for name, lines in families.items():
        kind = "gauge"
        out.write(f"# TYPE {name} {kind}\n")
        out.writelines(lines)
    out.write("# EOF\n")


def _ksm(ns: str, pod: str, **extra: str) -> dict[str, str]:
    return {"namespace": ns, "pod": pod, **extra, "job": "kube-state-metrics"}


def backfilled(root: Path) -> Path:
    """The week's history written and backfilled with promtool into `root/data`; the data
    directory."""
    openmetrics = root / "dcgm-history.om"
    with openmetrics.open("w") as out:
        write_openmetrics(out)
    backfill(require_tool("promtool"), openmetrics, root / "data")
    openmetrics.unlink()
    return root / "data"
