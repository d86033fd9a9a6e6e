"""Kernels that fault on purpose, launched through the CUDA driver with no
framework needed: for tests, demos, and checking that cuda_debug works here.

Each function launches one tiny kernel asynchronously on `device` (primary
context, shared with PyTorch/CuPy) and `stream` (a raw CUstream handle; 0 is
the legacy default stream), and returns. Like any framework, it raises if the
launch call fails - which, inside ``cuda_debug.launch_blocking()``, is where a
fault is found::

    >>> import cuda_debug, cuda_debug.testing as t
    >>> with cuda_debug.launch_blocking():
    ...     t.device_assert()
    DeviceAssertError: device-side assert in check_index<int>
      at <stdin>:2 in <module>:  t.device_assert()
      device: fault_kernels.cu:14 block [0,0,0] thread [3,0,0]: Assertion `idx[i] >= 0 && idx[i] < limit` failed.
      The CUDA context is now unusable: restart the process (in a notebook, restart the kernel).

A sticky fault kills the CUDA context of the whole process: run these in a
child process unless you mean to end this one.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
from . import _core, _libraries, _locations, _report

__all__ = ["device_assert", "illegal_address", "out_of_bounds_write", "trap",
           "misaligned_address", "bad_launch", "empty", "spin", "FAULTS"]


def _launch(kind: str, device: int, stream: int, arg: int = 0) -> None:
    from ._scope import watch_epoch
    _libraries.ensure(_libraries.CUDA)
    seq = _core.fault_seq()
    rc = _core.fault_launch(kind, device=device, stream=stream, arg=arg)
    if rc == 0:
        return
    err = _report.error_for(None, mark=seq, code=rc, watch_mark=watch_epoch(),
                            found_at="launch", frame=_locations.current_frame(2))
    assert err is not None          # (a launch that failed is always reported)
    raise err


def device_assert(device: int = 0, stream: int = 0) -> None:
    """Thread [3,0,0] fails ``assert(idx[i] >= 0 && idx[i] < limit)``: 710, sticky."""
    _launch("assert", device, stream)


def illegal_address(device: int = 0, stream: int = 0) -> None:
    """A store through an unmapped pointer: 700, sticky."""
    _launch("illegal_address", device, stream)


def out_of_bounds_write(past_end: int = 96, device: int = 0, stream: int = 0) -> None:
    """Thread [0,0,0] stores 4 bytes `past_end` bytes past the end of a 256-byte
    buffer (cuMemAlloc'd). Near the buffer it lands in the driver's 2 MiB page:
    nothing faults, memory is silently corrupted - what ``cuda-debug replay``
    names (``--kernel write_wild``). Far away (``1 << 36``) it is an illegal
    address: 700, sticky."""
    _launch("write_past", device, stream, int(past_end))


def trap(device: int = 0, stream: int = 0) -> None:
    """``__trap()``: 719 (unspecified launch failure), sticky."""
    _launch("trap", device, stream)


def misaligned_address(device: int = 0, stream: int = 0) -> None:
    """A 4-byte store at an odd address: 716, sticky."""
    _launch("misaligned", device, stream)


def bad_launch(device: int = 0, stream: int = 0) -> None:
    """4096 threads per block: the launch is refused (1, invalid argument);
    not sticky, the context stays usable."""
    _launch("bad_config", device, stream)


def empty(device: int = 0, stream: int = 0) -> None:
    """An empty kernel (launch-latency measurements)."""
    _launch("empty", device, stream)


def spin(seconds: float, device: int = 0, stream: int = 0) -> None:
    """One thread busy-waits `seconds` on the device (%globaltimer)."""
    _launch("spin", device, stream, int(seconds * 1e9))


#: fault name -> (function, expected exception class name, CUresult)
FAULTS = {
    "device_assert": (device_assert, "DeviceAssertError", 710),
    "illegal_address": (illegal_address, "IllegalAddressError", 700),
    "trap": (trap, "LaunchFailureError", 719),
    "misaligned_address": (misaligned_address, "MisalignedAddressError", 716),
    "bad_launch": (bad_launch, "LaunchError", 1),
}
