"""The reference workloads: what one iteration does, and how much it counts.

Each is a context manager that allocates its buffers (random data: zeros run faster on some
hardware), checks once that the operation runs on this device, yields a `Workload`, and frees the
buffers afterwards. An operation this torch or device cannot do raises `Unsupported` with the
reason, which the profile records instead of a figure.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

_FLOAT_DTYPES: Final = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
ELEMENT_BYTES: Final = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
GRAPH_KERNELS: Final = 100
"""Kernels captured in the CUDA graph whose replay measures graph launch latency."""


class Unsupported(Exception):
    """This torch or device cannot run the workload; `str()` says why, in one line."""


@dataclass(frozen=True, slots=True)
class Workload:
    work: Callable[[], object]
    units: float
    """What one iteration counts: floating-point (or integer) operations, bytes, or launches."""
    kind: Literal["rate", "latency"]
    """A rate is units per second (higher is better); a latency is seconds per unit."""
    size: str


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _probe(work: Callable[[], object], device: torch.device, what: str) -> None:
    """Run the operation once; a refusal from torch or the device becomes `Unsupported`."""
    try:
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
        raise Unsupported(f"{what} is not supported here: {_first_line(error)}") from error


def capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def _check_matmul_support(dtype: str, device: torch.device) -> None:
    cc = capability(device)
    if dtype == "tf32":
        if cc is None:
            raise Unsupported("tf32 is a tensor-core mode of NVIDIA GPUs; a CPU has no tf32 matmul")
        if cc < (8, 0):
            raise Unsupported(
                f"tf32 needs compute capability 8.0 or newer (this GPU: {cc[0]}.{cc[1]})"
            )
    if dtype == "fp8":
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            raise Unsupported(f"this torch ({torch.__version__}) has no fp8 matmul")
        if cc is not None and cc < (8, 9):
            raise Unsupported(
                f"fp8 matmul needs compute capability 8.9 or newer (this GPU: {cc[0]}.{cc[1]})"
            )
    if dtype == "int8" and not hasattr(torch, "_int_mm"):
        raise Unsupported(f"this torch ({torch.__version__}) has no int8 matmul")


@contextlib.contextmanager
def matmul(dtype: str, n: int, device: torch.device) -> Iterator[Workload]:
    """C = A @ B, all n x n: 2 n^3 operations per iteration."""
    _check_matmul_support(dtype, device)
    size = f"{n}x{n}x{n}"
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    # fp32 is measured as true fp32, tf32 with tensor cores allowed; restored afterwards.
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        work: Callable[[], object]
        if dtype in _FLOAT_DTYPES:
            kind = _FLOAT_DTYPES[dtype]
            a = torch.randn(n, n, device=device, dtype=kind)
            b = torch.randn(n, n, device=device, dtype=kind)
            c = torch.empty(n, n, device=device, dtype=kind)
            work = lambda: torch.mm(a, b, out=c)  # noqa: E731 - the iteration, named by the field
        elif dtype == "fp8":
            a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
            # the second operand column-major, as the fp8 GEMM requires
            b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
            scale = torch.ones((), device=device, dtype=torch.float32)
            work = lambda: torch._scaled_mm(  # noqa: E731
                a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16
            )
        elif dtype == "int8":
            a = torch.randint(-128, 128, (n, n), device=device, dtype=torch.int8)
            b = torch.randint(-128, 128, (n, n), device=device, dtype=torch.int8)
            work = lambda: torch._int_mm(a, b)  # noqa: E731
        else:
            raise Unsupported(f"unknown dtype {dtype!r}")
        _probe(work, device, f"{dtype} matmul")
        yield Workload(work, 2.0 * n**3, "rate", size)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
        _release(device)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


@contextlib.contextmanager
def memory_copy(nbytes: int, device: torch.device) -> Iterator[Workload]:
    """dst <- src, streaming: counts the bytes read plus the bytes written."""
    source = torch.rand(nbytes // 4, device=device, dtype=torch.float32)
    target = torch.empty_like(source)
    try:
        work = lambda: target.copy_(source)  # noqa: E731
        _probe(work, device, "device copy")
        yield Workload(work, 2.0 * source.numel() * 4, "rate", _size(nbytes))
    finally:
        _release(device)


@contextlib.contextmanager
def memory_read(nbytes: int, device: torch.device) -> Iterator[Workload]:
    """A sum over the buffer: reads every byte once, writes almost nothing."""
    source = torch.rand(nbytes // 4, device=device, dtype=torch.float32)
    try:
        work = lambda: torch.sum(source)  # noqa: E731
        _probe(work, device, "device reduction")
        yield Workload(work, float(source.numel() * 4), "rate", _size(nbytes))
    finally:
        _release(device)


@contextlib.contextmanager
def transfer(
    direction: Literal["host_to_device", "device_to_host"], nbytes: int, device: torch.device
) -> Iterator[Workload]:
    """One copy between pinned host memory and the device, asynchronous on the stream."""
    if device.type != "cuda":
        raise Unsupported("the device is the host itself: there is no host-device link to measure")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 256)
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        if direction == "host_to_device":
            work = lambda: on_device.copy_(host, non_blocking=True)  # noqa: E731
        else:
            work = lambda: host.copy_(on_device, non_blocking=True)  # noqa: E731
        _probe(work, device, "pinned copy")
        yield Workload(work, float(nbytes), "rate", f"{_size(nbytes)} pinned")
    finally:
        _release(device)


@contextlib.contextmanager
def launch(device: torch.device) -> Iterator[Workload]:
    """One tiny in-place add per iteration: what a PyTorch kernel launch costs."""
    x = torch.zeros(1, device=device)
    try:
        work = lambda: x.add_(1.0)  # noqa: E731
        _probe(work, device, "tiny kernel")
        yield Workload(work, 1.0, "latency", "1 element")
    finally:
        _release(device)


@contextlib.contextmanager
def graph_launch(device: torch.device) -> Iterator[Workload]:
    """`GRAPH_KERNELS` tiny adds captured in one CUDA graph; one replay per iteration."""
    if device.type != "cuda":
        raise Unsupported("CUDA graphs need a CUDA device")
    x = torch.zeros(1, device=device)
    try:
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # untyped upstream
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up on a side stream before capture, as torch asks
            for _ in range(3):
                x.add_(1.0)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(GRAPH_KERNELS):
                    x.add_(1.0)
        except RuntimeError as error:
            raise Unsupported(f"CUDA graph capture failed: {_first_line(error)}") from error
        _probe(graph.replay, device, "CUDA graph replay")
        yield Workload(graph.replay, float(GRAPH_KERNELS), "latency", f"{GRAPH_KERNELS} kernels")
    finally:
        _release(device)
