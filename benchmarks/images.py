"""How large gpuscope's two container images are: the Dockerfile's `daemon` and `jobs` targets
built with podman over the tests' stand-in base (Debian bookworm's python3, tests/container.py),
their sizes as `podman image inspect` reports them and what each adds over the base; prints one
JSON document.

    .venv/bin/python benchmarks/images.py                        # daemon + jobs (rightsize only)
    .venv/bin/python benchmarks/images.py --jobs-extras jobs     # the whole jobs image (PyTorch's
                                                                 # CUDA build: a multi-GB download)

The jobs' image defaults to `JOBS_EXTRAS=rightsize`, as the container test builds it; the whole
`jobs` extra adds PyTorch's CUDA wheels from PyPI. The images are tagged apart and removed at the
end; the base stays cached, as the tests keep it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.container import BASE_IMAGE, build_image, ensure_base_image, podman, podman_env  # noqa: E402

MB: Final = 1_000_000


def size(image: str, env: dict[str, str]) -> int:
    answer = podman("image", "inspect", "--format={{.Size}}", image, env=env)
    return int(answer.stdout.strip())


def build(target: str, tag: str, env: dict[str, str], *build_args: str) -> float:
    """Seconds to build `target`."""
    started = time.monotonic()
    build_image(env, target, tag, *build_args, timeout=3600)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs-extras",
        default="rightsize",
        choices=("rightsize", "calibrate", "jobs"),
        help="the extras the jobs' image holds (default: rightsize, as the container test builds)",
    )
    arguments = parser.parse_args()
    env = podman_env()
    ensure_base_image(env)
    run = uuid.uuid4().hex[:8]
    images = {
        "daemon": (f"localhost/gpuscope-bench:{run}", ()),
        "jobs": (
            f"localhost/gpuscope-jobs-bench:{run}",
            (f"JOBS_EXTRAS={arguments.jobs_extras}",),
        ),
    }
    base = size(BASE_IMAGE, env)
    result: dict[str, Any] = {
        "base": {"image": BASE_IMAGE, "mb": round(base / MB, 1)},
        "jobs_extras": arguments.jobs_extras,
    }
    try:
        for target, (tag, build_args) in images.items():
            seconds = build(target, tag, env, *build_args)
            total = size(tag, env)
            result[target] = {
                "mb": round(total / MB, 1),
                "over_base_mb": round((total - base) / MB, 1),
                "build_seconds": round(seconds, 1),
            }
    finally:
        for tag, _ in images.values():
            podman("rmi", "--force", tag, env=env, check=False)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
