"""The known cluster the rightsizing tests backfill: one workload per answer the strategy gives.

Expected answers (default settings, built-in catalog prices):
- research/notebook-alice holds an H100 and never runs a process on it: idle, release.
- serving/chat-small uses ~7% of an A100 80GB's SMs and 7 GiB: underused, -> A100 80GB MIG 1g.10gb.
  The daemon on its node restarted 100 h before the end, splitting each of its series in two.
- training/embed-finetune keeps 70 GiB on an A100 80GB: memory-bound (capacity), keep.
- training/llm-pretrain keeps 8 H100s' SMs 90% busy, tensor cores ahead of DRAM: compute-bound.
- training/resnet-train runs its A100 40GB at ~35% while its 4-core CPU limit is exhausted:
  input-bound, add CPU.
- serving/new-ranker started 2 h ago: undefined (not enough data).
- serving/tts and serving/asr time-slice one A100 80GB at ~15% each: underused, -> 2g.20gb each.
  asr's demand rose by 20 points over the last 12 hours: the trend is rising, and the last day
  alone would want a 3g.40gb, so its confidence is at most medium.
- serving/rerank runs 3 replicas, each on an A100 80GB at ~12%, autoscaled by an HPA (2-6 on
  cpu): underused, -> 2g.20gb per replica, and the reason says it is sized per replica.
"""

from __future__ import annotations

from tests.synthetic_history import FakeWorkload, Wave

H100 = "NVIDIA H100 80GB HBM3"
A100_80 = "NVIDIA A100-SXM4-80GB"
A100_40 = "NVIDIA A100-SXM4-40GB"
END = 1_780_000_200
"""The history's last instant: 2026-05-28T20:30:00Z, on a 5-minute boundary."""

CALIBRATION = {H100: ({"bf16": 800e12, "fp16": 800e12, "fp32": 55e12}, 3.0e12)}

WORKLOADS = [
    FakeWorkload(
        "research", "notebook-alice", kind="StatefulSet", model=H100, labels={"team": "research"}
    ),
    FakeWorkload(
        "serving",
        "chat-small",
        model=A100_80,
        busy=Wave(0.10, 0.03, jitter=0.01),
        memory_gib=Wave(6.0, 0.8, jitter=0.2),
        sm=Wave(0.06, 0.015, jitter=0.005),
        tensor=Wave(0.03, 0.01),
        dram=Wave(0.04, 0.01),
        cpu_limit=8,
        cpu_usage=Wave(1.5, 0.3, jitter=0.1),
        daemon_restart_hours=100,
        labels={"team": "serving"},
    ),
    FakeWorkload(
        "training",
        "embed-finetune",
        kind="Job",
        model=A100_80,
        busy=Wave(0.5, 0.1, jitter=0.02),
        memory_gib=Wave(70.0, 1.5, jitter=0.3),
        labels={"team": "research"},
    ),
    FakeWorkload(
        "training",
        "llm-pretrain",
        kind="Job",
        model=H100,
        pods=2,
        gpus_per_pod=4,
        busy=Wave(0.97, 0.01, jitter=0.01),
        memory_gib=Wave(74.0, 0.5, jitter=0.2),
        sm=Wave(0.90, 0.02, jitter=0.01),
        tensor=Wave(0.75, 0.02),
        dram=Wave(0.35, 0.03),
        cpu_limit=32,
        cpu_usage=Wave(12, 2, jitter=1),
        labels={"team": "research"},
    ),
    FakeWorkload(
        "training",
        "resnet-train",
        kind="Job",
        model=A100_40,
        busy=Wave(0.35, 0.08, jitter=0.03),
        memory_gib=Wave(18.0, 1.0),
        cpu_limit=4,
        cpu_usage=Wave(3.97, 0.02, jitter=0.02),
        labels={"team": "vision"},
    ),
    FakeWorkload(
        "serving",
        "new-ranker",
        model=H100,
        busy=Wave(0.3, 0.05, period=3600),
        memory_gib=Wave(20.0),
        hours=2,
        labels={"team": "serving"},
    ),
    FakeWorkload(
        "serving",
        "tts",
        model=A100_80,
        busy=Wave(0.15, 0.05, jitter=0.005),
        memory_gib=Wave(9.0, 1.0),
        shared_uuid="GPU-5a4e0c11-shared",
        labels={"team": "serving"},
    ),
    FakeWorkload(
        "serving",
        "asr",
        model=A100_80,
        busy=Wave(0.14, 0.05, period=43200, jitter=0.005, rise=0.2, rise_from=END - 12 * 3600),
        memory_gib=Wave(10.0, 0.5),
        shared_uuid="GPU-5a4e0c11-shared",
        labels={"team": "serving"},
    ),
    FakeWorkload(
        "serving",
        "rerank",
        model=A100_80,
        pods=3,
        busy=Wave(0.12, 0.03, jitter=0.01),
        memory_gib=Wave(10.0, 0.8, jitter=0.2),
        autoscaler=(2, 6, "cpu"),
        labels={"team": "serving"},
    ),
]
