"""cuda_debug: make asynchronous CUDA failures debuggable, and their cost measurable.

    with cuda_debug.watch():                # kernels stay asynchronous; a fault that
        train(model, loader)                # surfaces later names its launch and line

    with cuda_debug.launch_blocking():      # synchronous launches for this region
        loss = criterion(logits, target)    # a device assert raises right here

    with cuda_debug.guard():                # a label outside [0, C) raises GuardIndexError
        loss = criterion(logits, target)    # before any kernel runs: the process lives on

Errors: CudaError and its subclasses (DeviceAssertError, IllegalAddressError, ...)
carry the kernel, the launching line and the device's assert text.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
from . import _options as _options      # reads and checks CUDA_DEBUG_* now (warns at import)

__version__ = "0.1.0"

# The public names and the module that defines each. They are imported on first
# use (PEP 562), so that ``import cuda_debug`` - which pytest does at every start
# through the pytest11 entry point - imports nothing but this and _options
# (benchmarks/import_cost.py). Type checkers and IDEs read the same names from the
# imports under TYPE_CHECKING below (a constant, not typing.TYPE_CHECKING: importing
# typing costs milliseconds); tests/house/test_import_and_types.py checks that the two agree.
_PUBLIC = {
    "._scope": ["watch", "is_watching", "launch_blocking", "is_launch_blocking", "check",
                "last_error"],
    "._guard": ["guard", "is_guarding"],
    "._errors": ["GuardError", "GuardIndexError", "GuardValueError", "CudaError", "CudaUnavailableError", "ToolConflictError", "LaunchError",
                 "StickyCudaError", "DeviceAssertError", "IllegalAddressError",
                 "LaunchFailureError", "MisalignedAddressError", "IllegalInstructionError",
                 "InvalidAddressSpaceError", "InvalidPcError", "HardwareStackError",
                 "LaunchTimeoutError"],
    "._hangs": ["in_flight", "InFlight"],
}
_SUBMODULES = ("bench", "testing")      # cuda_debug.bench brings NumPy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, List, Optional, Sequence, Union

    from . import bench as bench, testing as testing
    from ._scope import (watch as watch, is_watching as is_watching,
                         launch_blocking as launch_blocking,
                         is_launch_blocking as is_launch_blocking, check as check,
                         last_error as last_error)
    from ._guard import (guard as guard, is_guarding as is_guarding)
    from ._hangs import (in_flight as in_flight, InFlight as InFlight)
    from ._errors import (GuardError as GuardError, GuardIndexError as GuardIndexError,
                          GuardValueError as GuardValueError)
    from ._errors import (CudaError as CudaError, CudaUnavailableError as CudaUnavailableError,
                          ToolConflictError as ToolConflictError, LaunchError as LaunchError,
                          StickyCudaError as StickyCudaError,
                          DeviceAssertError as DeviceAssertError,
                          IllegalAddressError as IllegalAddressError,
                          LaunchFailureError as LaunchFailureError,
                          MisalignedAddressError as MisalignedAddressError,
                          IllegalInstructionError as IllegalInstructionError,
                          InvalidAddressSpaceError as InvalidAddressSpaceError,
                          InvalidPcError as InvalidPcError,
                          HardwareStackError as HardwareStackError,
                          LaunchTimeoutError as LaunchTimeoutError)
else:
    # Run time only: a type checker that saw a module __getattr__ would accept any
    # name (a typo included) as Any.
    def __getattr__(name):
        import importlib
        if _waiting and (name in _WHERE or name in _SUBMODULES or name == "_core"):
            _arm()                     # the first use of cuda_debug under pytest
        if name in _WHERE:
            value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        elif name in _SUBMODULES:
            value = importlib.import_module("." + name, __name__)
        elif name == "_core":
            try:
                return importlib.import_module("._core", __name__)
            except ModuleNotFoundError as e:
                if e.name != __name__ + "._core":
                    raise
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
del TYPE_CHECKING

_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

# Written out (not computed from _PUBLIC): type checkers read `from cuda_debug import *`
# from it; tests/house/test_import_and_types.py checks it is _PUBLIC's names.
__all__ = [
    "watch", "is_watching", "launch_blocking", "is_launch_blocking", "check", "last_error",
    "guard", "is_guarding",
    "GuardError", "GuardIndexError", "GuardValueError", "CudaError", "CudaUnavailableError",
    "ToolConflictError", "LaunchError", "StickyCudaError", "DeviceAssertError",
    "IllegalAddressError", "LaunchFailureError", "MisalignedAddressError",
    "IllegalInstructionError", "InvalidAddressSpaceError", "InvalidPcError",
    "HardwareStackError", "LaunchTimeoutError",
    "in_flight", "InFlight",
]


def __dir__() -> "list[str]":
    return sorted(list(globals()) + __all__ + list(_SUBMODULES))


class _TorchGraphsFinder:
    """A ``sys.meta_path`` entry that finds nothing itself: when
    ``torch.cuda.graphs`` is imported, it lets the module run, then wraps
    ``torch.cuda.CUDAGraph``'s capture end (cuda_debug/_graphs.py: graphs captured
    before watch() are read at their end), and steps out of ``sys.meta_path``."""

    busy = False

    def find_spec(self, name: str, path: "Optional[Sequence[Union[bytes, str]]]" = None,
                  target: "Optional[ModuleType]" = None) -> "Optional[ModuleSpec]":
        if name != "torch.cuda.graphs" or self.busy:
            return None
        import importlib.util
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        # (a loader in all but its base class: it forwards to the module's own)
        spec.loader = _InstallAfter(spec.loader, self)  # type: ignore[assignment]
        return spec


class _InstallAfter:
    """The module's own loader, and cuda_debug's wrapper installed once it ran."""

    def __init__(self, loader: "Any", finder: _TorchGraphsFinder):
        self._loader, self._finder = loader, finder

    def create_module(self, spec: "ModuleSpec") -> "Optional[ModuleType]":
        module: "Optional[ModuleType]" = self._loader.create_module(spec)
        return module

    def exec_module(self, module: "ModuleType") -> None:
        self._loader.exec_module(module)
        import sys
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        try:
            from . import _graphs
            _graphs.install(module)
        except Exception:          # never break `import torch`
            pass

    def __getattr__(self, name: str) -> "Any":
        return getattr(self._loader, name)


def _hook_torch_graphs() -> None:
    import sys
    if not _options.OPTIONS.graph_adopt:
        return
    if "torch.cuda.graphs" in sys.modules:
        try:
            from . import _graphs
            _graphs.install()
        except Exception:
            pass
    elif not any(isinstance(f, _TorchGraphsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchGraphsFinder())


# Under pytest, `import cuda_debug` is first the plugin's (pytest11): it runs in every
# pytest process of the environment, used or not. There the hook waits for the first use
# of cuda_debug (a public name, the C core, or the plugin asked by an option, a marker or
# a fixture: docs/pytest.md); elsewhere it is set at import, before torch captures.
def _under_pytest() -> bool:
    import sys
    return "_pytest" in sys.modules


_waiting = _under_pytest()


def _arm() -> None:
    """Set the hook now (once; a no-op where it was set at import)."""
    global _waiting
    _waiting = False
    _hook_torch_graphs()


if not _waiting:
    _hook_torch_graphs()


def load_ipython_extension(ipython: "object") -> None:
    """``%load_ext cuda_debug``: the %cuda_watch / %cuda_guard / %cuda_launch_blocking
    magics (line and cell; %launch_blocking is an old name) and short reports."""
    from . import _notebook
    _notebook.load(ipython)


def unload_ipython_extension(ipython: "object") -> None:
    """``%unload_ext cuda_debug``: the magics and the short reports taken away."""
    from . import _notebook
    _notebook.unload(ipython)
