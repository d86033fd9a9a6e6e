"""Imported by a child script (fake_cuda.PRELUDE) BEFORE cuda_debug: preloads
the fake libcuda.so.1 and libcupti.so.13 from $CD_TEST_FAKE_DIR, globally,
so that cuda_debug's loader (dlopen(soname, RTLD_NOLOAD) first) binds them.

``fake`` is the ctypes handle of the fake driver with the control API typed
(calls through ctypes.CDLL release the GIL, as PyTorch does around launches).
Call ``fake.fake_launch(...)`` directly from the script: a Python wrapper here
would become the innermost "user" frame of a report.

With CD_TEST_FAKE_PRELOAD=0 nothing is loaded here (LD_LIBRARY_PATH mode):
``fake`` then binds, on first use, to the copy cuda_debug's loader opened.
"""
import ctypes
import os
import sys

from . import LIBCUDA, LIBCUPTI, cbids

FAKE_DIR = os.environ["CD_TEST_FAKE_DIR"]
_PRELOAD = os.environ.get("CD_TEST_FAKE_PRELOAD", "1") != "0"

if _PRELOAD and "cuda_debug._core" in sys.modules:
    raise RuntimeError("fake_cuda must be loaded before cuda_debug is imported")

c_char_p, c_int, c_long, c_longlong = ctypes.c_char_p, ctypes.c_int, ctypes.c_long, ctypes.c_longlong
c_uint, c_size = ctypes.c_uint, ctypes.c_size_t

_SIGNATURES = {
    "fake_reset": (None, []),
    "fake_set_init_result": (None, [c_int]),
    "fake_reset_stats": (None, []),
    "fake_set_kernel": (None, [c_char_p, c_int, c_int, c_char_p, c_long, c_longlong]),
    "fake_set_assert_site": (c_int, [c_char_p, c_char_p, c_int, c_char_p]),
    "fake_set_async": (None, [c_int]),
    "fake_set_driver_log": (None, [c_int]),
    "fake_set_print_thread": (None, [c_int]),
    "fake_launch": (c_int, [c_char_p, c_size] + [c_uint] * 6),
    "fake_launch_ex": (c_int, [c_char_p, c_size] + [c_uint] * 6),
    "fake_aten_embedding": (c_int, [c_char_p]),
    "fake_launch_cooperative": (c_int, [c_char_p, c_size] + [c_uint] * 6),
    "fake_stream_create": (c_size, []),
    "fake_stream_sync": (c_int, [c_size]),
    "fake_ctx_sync": (c_int, []),
    "fake_begin_capture": (c_int, [c_size]),
    "fake_end_capture": (c_int, [c_size, ctypes.POINTER(c_size)]),
    "fake_graph_launch": (c_int, [c_size, c_size]),
    "fake_capture_status": (c_int, [c_size]),
    "fake_primary_ctx_reset": (c_int, []),
    "fake_ctx_uid": (c_uint, []),
    "fake_refuse_resource": (None, [c_int]),
    "fake_refuse_capture_memset": (None, [c_int]),
    "fake_event_create": (c_size, []),
    "fake_event_record": (c_int, [c_size, c_size]),
    "fake_stream_wait_event": (c_int, [c_size, c_size]),
    "fake_graph_exec_destroy": (c_int, [c_size]),
    "fake_graph_destroy": (c_int, [c_size]),
    "fake_graph_ops": (c_int, [c_size, ctypes.POINTER(c_int)]),
    "fake_refuse_cbids": (None, [ctypes.POINTER(c_int), c_int]),
    "fake_hold_cupti": (None, [c_char_p]),
    "fake_cupti_fail_when_dead": (None, [c_int]),
    "fake_cupti_enabled": (c_int, [c_int]),
    "fake_cupti_finalizes": (c_int, []),
    "fake_cupti_finalizes_outside_exit": (c_int, []),
    "fake_cupti_inits": (c_int, []),
    "fake_sticky": (c_int, []),
    "fake_set_thread_name": (c_int, [c_char_p, c_int]),
    "fake_glibc_error_from_thread": (c_int, [c_long]),
    "fake_glibc_error_done": (c_int, [c_int]),
    "fake_stats": (c_int, [ctypes.POINTER(c_longlong), c_int]),
    "fake_rename_function": (c_int, [c_char_p, c_char_p]),
    "fake_launch_loop": (c_long, [c_char_p, c_long]),
    "fake_launch_n": (c_int, [c_char_p, c_size, c_long]),
    "fake_tools_ids": (None, [c_int]),
    "fake_launch_on_fiber": (c_int, [c_char_p]),
    "fake_call_below_stale_frame": (c_int, [ctypes.c_void_p]),
    "fake_count_signal": (c_int, [c_int, c_long]),
    "fake_signal_calls": (c_int, []),
}


def _typed(lib):
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


class _Lazy:
    """The fake driver's handle, bound on first use (LD_LIBRARY_PATH mode)."""

    def __init__(self):
        self._lib = None

    def __getattr__(self, name):
        if self.__dict__.get("_lib") is None:
            self.__dict__["_lib"] = _typed(ctypes.CDLL(LIBCUDA, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD))
        return getattr(self.__dict__["_lib"], name)


if _PRELOAD:
    fake = _typed(ctypes.CDLL(os.path.join(FAKE_DIR, LIBCUDA), mode=ctypes.RTLD_GLOBAL))
    _cupti = ctypes.CDLL(os.path.join(FAKE_DIR, LIBCUPTI), mode=ctypes.RTLD_GLOBAL)
else:
    fake = _Lazy()

STAT_NAMES = ("callbacks", "launch_calls", "kernels_run", "writes", "dropped", "syncs",
              "lines_printed", "log_lines", "captured", "refused")


def fake_stats():
    """The fake's counters: callbacks fired, launch API calls, kernels run,
    stream writes executed, operations dropped (dead context), synchronising
    calls, assert lines printed, driver-log lines, launches captured, launches
    refused (bad configuration)."""
    out = (c_longlong * len(STAT_NAMES))()
    fake.fake_stats(out, len(STAT_NAMES))
    return dict(zip(STAT_NAMES, out))


def at(name):
    """A kernel name as PyTorch's own kernels are named (mangled, in at::native):
    ``at("ok_k") == b"_ZN2at6native4ok_kEv"`` (demangled ``at::native::ok_k()``,
    short name ``ok_k``). The always-on watch() gives a plain name (a user's or a
    JIT kernel: Triton's, CuPy's, the driver's callers') a marker at every launch;
    tests of its sparse markers use these."""
    if isinstance(name, str):
        name = name.encode()
    return b"_ZN2at6native%d%sEv" % (len(name), name)


def cbid(name):
    """CUPTI driver callback id of API `name` (``cbid("cuLaunchKernel") == 307``)."""
    return cbids()[name]


def refuse_cbids(names):
    """cuptiEnableCallback refuses these APIs' ids (an older CUPTI)."""
    ids = [cbid(n) for n in names]
    fake.fake_refuse_cbids((c_int * len(ids))(*ids), len(ids))
