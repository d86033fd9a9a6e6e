"""cuda_debug: make asynchronous CUDA failures debuggable, and their cost measurable.

    with cuda_debug.launch_blocking():      # synchronous launches for this region
        loss = criterion(logits, target)    # a device assert raises right here

Errors: CudaError and its subclasses (DeviceAssertError, IllegalAddressError, ...)
carry the kernel, the launching line and the device's assert text.
"""
from ._errors import (CudaError, CudaUnavailableError, DeviceAssertError,
                      HardwareStackError, IllegalAddressError, IllegalInstructionError,
                      InvalidAddressSpaceError, InvalidPcError, LaunchError,
                      LaunchFailureError, LaunchTimeoutError, MisalignedAddressError,
                      StickyCudaError, ToolConflictError)
from ._scope import check, is_launch_blocking, last_error, launch_blocking

__version__ = "0.1.0"

__all__ = [
    "launch_blocking", "is_launch_blocking", "check", "last_error",
    "CudaError", "CudaUnavailableError", "ToolConflictError", "LaunchError",
    "StickyCudaError", "DeviceAssertError", "IllegalAddressError", "LaunchFailureError",
    "MisalignedAddressError", "IllegalInstructionError", "InvalidAddressSpaceError",
    "InvalidPcError", "HardwareStackError", "LaunchTimeoutError",
]


def __getattr__(name):
    """``cuda_debug.bench`` is imported on first use (it brings NumPy)."""
    if name == "bench":
        import importlib
        return importlib.import_module(".bench", __name__)
    raise AttributeError("module 'cuda_debug' has no attribute %r" % name)


def load_ipython_extension(ipython):
    """``%load_ext cuda_debug``: the %launch_blocking magics and short reports."""
    from . import _notebook
    _notebook.load(ipython)


def unload_ipython_extension(ipython):
    from . import _notebook
    _notebook.unload(ipython)
