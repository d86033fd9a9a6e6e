"""Stress on the GPU: 10,000 scope and watch cycles from 4 threads (an empty
kernel each) leave nothing behind: resident memory, open file descriptors and
CUPTI subscriptions are the same at the end as after the first 100 cycles;
memory is measured after 100, N and 2N more (check_cycles: malloc_trim, then
mallinfo2, Python's object count, resident memory), so that a leak, which
grows the longer second batch in proportion, is told from allocator slack.
The fake-driver version, and what the child does: tests/test_fake_driver_stress.py.
"""
import os
import textwrap

import pytest

from test_fake_driver_stress import CYCLES_CHILD, check_cycles

GPU_CYCLES = int(os.environ.get("CD_TEST_STRESS_CYCLES", "10000"))


@pytest.mark.gpu
def test_gpu_scope_and_watch_cycles_leave_nothing_behind(child):
    c = child("CYCLES = %d\nfrom cuda_debug import _core as _c\n"
              "subscribed = lambda: int(_c.stats()['subscribed'])\n" % GPU_CYCLES
              + textwrap.dedent(CYCLES_CHILD), timeout=300)
    assert c.result is not None, c
    check_cycles(c.result, GPU_CYCLES)
