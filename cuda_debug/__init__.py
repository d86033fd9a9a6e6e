"""cuda_debug: make asynchronous CUDA failures debuggable, and their cost measurable.

    with cuda_debug.watch():                # kernels stay asynchronous; a fault that
        train(model, loader)                # surfaces later names its launch and line

    with cuda_debug.launch_blocking():      # synchronous launches for this region
        loss = criterion(logits, target)    # a device assert raises right here

Errors: CudaError and its subclasses (DeviceAssertError, IllegalAddressError, ...)
carry the kernel, the launching line and the device's assert text.
"""
import importlib
import importlib.util

from . import _options as _options      # reads and checks CUDA_DEBUG_* now (warns at import)

__version__ = "0.1.0"

# The public names and the module that defines each. They are imported on first
# use (PEP 562), so that ``import cuda_debug`` - which pytest does at every start
# through the pytest11 entry point - costs about a millisecond, not 25.
_PUBLIC = {
    "._scope": ["watch", "is_watching", "launch_blocking", "is_launch_blocking", "check",
                "last_error"],
    "._errors": ["CudaError", "CudaUnavailableError", "ToolConflictError", "LaunchError",
                 "StickyCudaError", "DeviceAssertError", "IllegalAddressError",
                 "LaunchFailureError", "MisalignedAddressError", "IllegalInstructionError",
                 "InvalidAddressSpaceError", "InvalidPcError", "HardwareStackError",
                 "LaunchTimeoutError"],
    "._hangs": ["in_flight", "InFlight"],
}
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}
_SUBMODULES = ("bench", "testing")

__all__ = [name for names in _PUBLIC.values() for name in names]


def __getattr__(name):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    elif name in _SUBMODULES:          # cuda_debug.bench brings NumPy
        value = importlib.import_module("." + name, __name__)
    elif name == "_core" and importlib.util.find_spec(__name__ + "._core") is None:
        # `from . import _core` with no built extension: say why, not just "cannot import".
        raise ImportError(
            "cuda_debug's C extension (cuda_debug._core) is not built in %s. If cuda_debug "
            "is installed, this source checkout shadows it (`python -m` puts the current "
            "folder first on sys.path): run from another folder, or build the checkout "
            "with `python3 -m pip install -e .`" % __path__[0], name=__name__ + "._core")
    else:
        raise AttributeError("module 'cuda_debug' has no attribute %r" % name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__ + list(_SUBMODULES))


def load_ipython_extension(ipython):
    """``%load_ext cuda_debug``: the %cuda_watch / %launch_blocking magics and short reports."""
    from . import _notebook
    _notebook.load(ipython)


def unload_ipython_extension(ipython):
    from . import _notebook
    _notebook.unload(ipython)
