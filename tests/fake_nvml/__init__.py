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
    STATE_ENV,
    FakeDevice,
    FakeNvmlState,
    FakeProcess,
    FakeProcessSample,
)

__all__ = [
    "LIBRARY_NAME",
    "STATE_ENV",
    "FakeDevice",
    "FakeNvmlState",
    "FakeProcess",
    "FakeProcessSample",
    "build_fake_nvml",
    "exported_functions",
    "nvml_header_dir",
]
