"""A fake NVIDIA driver library (``libnvidia-ml.so.1``) for testing NVML clients.

``build_fake_nvml(dir)`` compiles it against the real ``nvml.h``; put ``dir`` on
``LD_LIBRARY_PATH`` of a subprocess (or ``ctypes.CDLL(dir / LIBRARY_NAME)`` before
``pynvml.nvmlInit()`` in-process) and point ``$FAKE_NVML_STATE`` at a file written by
``FakeNvmlState.write``.
"""

from tests.fake_nvml.build import (
    LIBRARY_NAME,
    build_fake_nvml,
    exported_functions,
    nvml_header_dir,
)
from tests.fake_nvml.state import (
    DOUBLE_BIT_ECC_EVENT,
    SINGLE_BIT_ECC_EVENT,
    STATE_ENV,
    XID_EVENT,
    FakeDevice,
    FakeEvent,
    FakeMigInstance,
    FakeNvLink,
    FakeNvmlState,
    FakeProcess,
    FakeProcessSample,
)

__all__ = [
    "DOUBLE_BIT_ECC_EVENT",
    "LIBRARY_NAME",
    "SINGLE_BIT_ECC_EVENT",
    "STATE_ENV",
    "XID_EVENT",
    "FakeDevice",
    "FakeEvent",
    "FakeMigInstance",
    "FakeNvLink",
    "FakeNvmlState",
    "FakeProcess",
    "FakeProcessSample",
    "build_fake_nvml",
    "exported_functions",
    "nvml_header_dir",
]
