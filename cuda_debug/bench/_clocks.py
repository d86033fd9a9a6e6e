"""SM clocks and the driver version through NVML (libnvidia-ml), when present:
what a GEMM rate must be read next to.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import math
import threading
from typing import List, Optional

import numpy as np


class Nvml:
    """SM clocks and the driver version through NVML (libnvidia-ml), if present.
    Everything here fails soft: None when NVML cannot answer."""

    _lib = None
    _tried = False
    _lock = threading.Lock()

    @classmethod
    def lib(cls):
        with cls._lock:
            if not cls._tried:
                cls._tried = True
                try:
                    import ctypes
                    lib = ctypes.CDLL("libnvidia-ml.so.1")
                    if lib.nvmlInit_v2() == 0:
                        cls._lib = lib
                except Exception:
                    cls._lib = None
            return cls._lib

    @classmethod
    def handle(cls, pci_bus: int):
        lib = cls.lib()
        if lib is None:
            return None
        import ctypes

        class PciInfo(ctypes.Structure):
            # nvmlPciInfo_t, padded: NVML writes no more than the real struct
            _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                        ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                        ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                        ("busId", ctypes.c_char * 32), ("_pad", ctypes.c_char * 64)]
        try:
            count = ctypes.c_uint(0)
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return None
            for i in range(count.value):
                h = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                    continue
                pci = PciInfo()
                if lib.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci)) == 0 and pci.bus == pci_bus:
                    return h
        except Exception:
            return None
        return None

    @classmethod
    def sm_mhz(cls, handle) -> Optional[int]:
        lib = cls.lib()
        if lib is None or handle is None:
            return None
        import ctypes
        mhz = ctypes.c_uint(0)
        try:
            if lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(mhz)) != 0:  # NVML_CLOCK_SM
                return None
        except Exception:
            return None
        return int(mhz.value)

    @classmethod
    def max_sm_mhz(cls, handle) -> Optional[int]:
        lib = cls.lib()
        if lib is None or handle is None:
            return None
        import ctypes
        mhz = ctypes.c_uint(0)
        try:
            if lib.nvmlDeviceGetMaxClockInfo(handle, 1, ctypes.byref(mhz)) != 0:
                return None
        except Exception:
            return None
        return int(mhz.value) or None

    @classmethod
    def driver_version(cls) -> Optional[str]:
        lib = cls.lib()
        if lib is None:
            return None
        import ctypes
        buf = ctypes.create_string_buffer(96)
        try:
            if lib.nvmlSystemGetDriverVersion(buf, 96) != 0:
                return None
        except Exception:
            return None
        return buf.value.decode(errors="replace")


class ClockSampler:
    """Polls the SM clock every `interval` seconds while the timed C call runs
    (it releases the GIL)."""

    def __init__(self, handle, interval: float = 0.01):
        self.handle = handle
        self.interval = interval
        self.values: List[int] = []
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while not self._stop.is_set():
            v = Nvml.sm_mhz(self.handle)
            if v:
                self.values.append(v)
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, name="cuda_debug-clocks",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        v = Nvml.sm_mhz(self.handle)
        if v:
            self.values.append(v)
        return False

    def median(self) -> float:
        return float(np.median(self.values)) if self.values else math.nan


