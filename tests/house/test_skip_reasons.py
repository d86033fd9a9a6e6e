"""The suite's own skip reasons are one short sentence each: `addopts = "-ra"`
prints every one in the summary (tests/conftest.py)."""
from conftest import gpu_unavailable_reason, short_reason


def _one_short_sentence(text):
    return len(text) <= 101 and text.endswith(".") and ". " not in text and "\n" not in text


def test_the_no_gpu_reason_is_one_short_sentence():
    reason = gpu_unavailable_reason()
    if reason is not None:                        # (None where a GPU is usable)
        assert _one_short_sentence(reason), reason


def test_long_reasons_are_cut_to_their_first_clause():
    long = ("no CUDA driver: libcuda.so.1 could not be opened (libcuda.so.1: cannot open shared "
            "object file: No such file or directory; libcuda.so: cannot open shared object file: "
            "No such file or directory). Is an NVIDIA driver installed, and is this a machine "
            "(or container) with a GPU?")
    assert short_reason(long) == "no CUDA driver: libcuda.so.1 could not be opened."
    assert short_reason("CUPTI was not found (no candidate). Install it") == "CUPTI was not found."
    cut = short_reason("x" * 300)
    assert _one_short_sentence(cut) and cut.endswith("....")
