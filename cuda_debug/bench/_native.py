"""The boundary with the C core: the calls into ``_core``, the names of its raw
tuples (given once, here), and failure tuples turned into exceptions.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
from typing import NamedTuple, Optional, Tuple

import numpy as np

from .. import _core, _errors, _libraries
from ._config import check_device

_CUBLAS_STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
                  3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
                  8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                  13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                  15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}


class GemmSamples(NamedTuple):
    """What one ``_core.gemm`` call measured (milliseconds; arrays own C buffers)."""
    gpu_ms: np.ndarray         # CUDA-event time of each single GEMM
    call_ms: np.ndarray        # host time of each single call (+ its sync)
    loop_ms: np.ndarray        # wall time per GEMM of each loop
    loop_gpu_ms: np.ndarray    # event time per GEMM of each loop
    est_ms: float              # warm-up's wall time per GEMM
    loop_n: int                # GEMMs per loop
    lt_tried: int              # cuBLASLt candidates timed
    cublas_version: int        # major*10000 + minor*100 + patch, 0 unknown
    check: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]   # host A, B, C


class LatencySamples(NamedTuple):
    call_us: np.ndarray        # host time of each single launch (+ its sync)
    loop_us: np.ndarray        # wall time per launch of each loop


class DeviceInfo(NamedTuple):
    ordinal: int
    name: str
    total_bytes: int
    cc: Tuple[int, int]
    sm_count: int
    clock_khz: int
    mem_clock_khz: int
    l2_bytes: int
    pci_bus: int


def cuda_error(code: int, what: str) -> _errors.CudaError:
    from .. import _cuda_errors
    where = ""
    last = _core.last_call()
    if last and last[0] == code:
        where = ": %s at %s:%d" % (last[2], last[3], last[4])
    cls = _errors.class_for(code)
    return cls("%s: %s (%d): %s%s" % (what, _cuda_errors.name(code), code,
                                       _cuda_errors.description(code), where), code=code)


def failure(out: tuple, what: str) -> Exception:
    """The exception for a failure tuple (status, where) from C."""
    code, where = out[0], out[1]
    if where == "host":
        return MemoryError("%s: out of host memory" % what)
    if where == "unsupported":
        lib = _libraries.status(_libraries.CUBLAS)
        return _errors.CudaUnavailableError(
            "%s: cuBLASLt entry points were not found next to %s: use api='gemmex'"
            % (what, lib.path if lib else "libcublas"), missing="libcublasLt")
    if where == "cublas":
        last = _core.last_call()
        at = ": %s at %s:%d" % (last[2], last[3], last[4]) if last and last[1] == "cublas" else ""
        return _errors.CudaError("%s: cuBLAS failed: %s (%d)%s" % (
            what, _CUBLAS_STATUS.get(code, "cublasStatus_t"), code, at), cublas_status=code)
    return cuda_error(code, what)


def device_info(device: int = 0) -> DeviceInfo:
    """Driver up, `device` exists: its properties (raises otherwise)."""
    check_device(device)
    _libraries.ensure(_libraries.CUDA)
    rc, count = _core.device_count()
    if rc:
        raise cuda_error(rc, "cuDeviceGetCount")
    if device >= count:
        raise ValueError("device=%d: this machine has %d CUDA device%s"
                         % (device, count, "" if count == 1 else "s"))
    info = _core.device_info(int(device))
    if isinstance(info, int):
        raise cuda_error(info, "device_info(%d)" % device)
    name, total, major, minor, sms, clock, mclock, l2, bus = info
    return DeviceInfo(int(device), name, total, (major, minor), sms, clock, mclock, l2, bus)


def gemm(what: str, **kwargs) -> GemmSamples:
    out = _core.gemm(**kwargs)
    if out[0] != 0:
        raise failure(out, what)
    return GemmSamples(*out[2:])


def launch_latency(what: str, **kwargs) -> LatencySamples:
    out = _core.launch_latency(**kwargs)
    if out[0] != 0:
        raise failure(out, what)
    return LatencySamples(*out[2:])


def release(device: int, what: str) -> None:
    rc = _core.bench_release(device)
    if rc:
        raise cuda_error(rc, "%s: releasing the benchmark's buffers" % what)


def mem_info(device: int, what: str) -> Tuple[int, int]:
    rc, free_b, total_b = _core.mem_info(device)
    if rc:
        raise cuda_error(rc, "%s: cuMemGetInfo" % what)
    return free_b, total_b


def driver_string(v: Optional[int]) -> Optional[str]:
    return "%d.%d" % (v // 1000, (v % 1000) // 10) if v else None


def version_string(v: Optional[int], base: int = 100) -> Optional[str]:
    if not v:
        return None
    return "%d.%d.%d" % (v // (base * base), (v // base) % base, v % base)
