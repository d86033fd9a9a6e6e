"""Recognise a sticky CUDA error in any framework's exception.

A sticky error (device assert, illegal address, trap...) kills the CUDA context
of the process: every later CUDA call fails. cuda_debug's own errors say so
(``StickyCudaError``); frameworks raise their own exceptions and say it in
words: PyTorch ``torch.AcceleratorError: CUDA error: device-side assert
triggered``, CuPy ``CUDADriverError: CUDA_ERROR_ASSERT: device-side assert
triggered``, Triton ``Triton Error [CUDA]: an illegal memory access was
encountered``, JAX ``XlaRuntimeError: ... CUDA_ERROR_ILLEGAL_ADDRESS``, Numba
``CudaAPIError: [700] ...``.

Used by the pytest plugin, the notebook extension and ``python -m cuda_debug
run``; pure Python, no CUDA call.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
from typing import Optional

from . import _cuda_errors

#: The CUDA runtime's own short messages (cudaGetErrorString) for the sticky
#: codes, as PyTorch and Triton print them; they differ from cuda.h's
#: descriptions in the generated table.
RUNTIME_MESSAGES = {
    214: "uncorrectable ECC error encountered",
    700: "an illegal memory access was encountered",
    702: "the launch timed out and was terminated",
    710: "device-side assert triggered",
    714: "hardware stack error",
    715: "an illegal instruction was encountered",
    716: "misaligned address",
    717: "operation not supported on global/shared address space",
    718: "invalid program counter",
    719: "unspecified launch failure",
}

#: cudaError_t enumerator names where they do not follow from the driver's.
RUNTIME_NAMES = {
    214: "cudaErrorECCUncorrectable",
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
}

#: Modules whose exceptions may speak of CUDA errors in their own words.
GPU_MODULES = ("torch", "cupy", "cupy_backends", "cupyx", "triton", "jax", "jaxlib",
               "numba", "pycuda", "cuda", "cuda_debug", "tensorflow", "tinygrad")

# Words that make a message a CUDA one (the runtime's messages are generic English).
_CUDA_WORDS = ("cuda", "cublas", "cudnn", "cufft", "cusparse", "nccl", "accelerator")


def _module_of(exc: BaseException) -> str:
    return (type(exc).__module__ or "").split(".", 1)[0]


def is_gpu_exception(exc: BaseException) -> bool:
    """Could `exc` be a framework's CUDA error? RuntimeError and its subclasses
    (torch, CuPy, Triton, JAX raise those) or anything raised from a GPU
    framework's module; never an AssertionError (a test that prints a child's
    output saying "device-side assert triggered" did not poison this process),
    nor a GuardError (raised before anything was launched)."""
    from ._errors import GuardError
    if isinstance(exc, (AssertionError, KeyboardInterrupt, SystemExit, GuardError)):
        return False
    return isinstance(exc, RuntimeError) or _module_of(exc) in GPU_MODULES


def speaks_of_cuda(exc: BaseException) -> bool:
    """Does the exception's type or message mention CUDA (or cuBLAS, cuDNN...)?"""
    text = ("%s %s %s" % (type(exc).__module__, type(exc).__name__, _safe_str(exc))).lower()
    return any(w in text for w in _CUDA_WORDS)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not break the report
        return ""


def _one(exc: BaseException) -> Optional[int]:
    """The sticky code `exc` names, looking at this exception only."""
    from ._errors import CudaError
    if isinstance(exc, CudaError):
        return exc.code if exc.sticky else None
    if not is_gpu_exception(exc):
        return None
    text = "%s: %s" % (type(exc).__name__, _safe_str(exc))
    for code in _cuda_errors.STICKY:
        if _cuda_errors.name(code) in text or RUNTIME_NAMES.get(code, "\0") in text:
            return code
    cudaish = speaks_of_cuda(exc)
    if not cudaish:
        return None
    for attr in ("code", "status", "error_code"):
        v = getattr(exc, attr, None)
        if isinstance(v, int) and _cuda_errors.is_sticky(v):
            return v
    low = text.lower()
    for code, msg in RUNTIME_MESSAGES.items():
        if msg in low:
            return code
    return None


def sticky_code(exc: Optional[BaseException]) -> Optional[int]:
    """The sticky CUresult that `exc` (or an exception it was raised from)
    names, or None. cuda_debug's StickyCudaError by type; framework exceptions
    by their error code or words."""
    seen = 0
    while exc is not None and seen < 8:
        code = _one(exc)
        if code is not None:
            return code
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        seen += 1
    return None


def describe(code: int) -> str:
    """``CUDA_ERROR_ASSERT (device-side assert triggered)``"""
    msg = RUNTIME_MESSAGES.get(code)
    return "%s (%s)" % (_cuda_errors.name(code), msg) if msg else _cuda_errors.name(code)


def first_line(exc: BaseException) -> str:
    """``torch.AcceleratorError: CUDA error: device-side assert triggered``"""
    t = type(exc)
    mod = t.__module__ or ""
    name = t.__qualname__ if mod in ("builtins", "") else "%s.%s" % (mod.split(".")[0], t.__qualname__)
    msg = _safe_str(exc).strip().splitlines()
    return "%s: %s" % (name, msg[0]) if msg else name

