"""CUDA 12's CUPTI for the tests: ``libcupti.so.12`` from the
``nvidia-cuda-cupti-cu12`` wheel named by ``$CD_TEST_CUPTI12_WHEEL`` (the
``.whl`` itself, or a folder holding one), unpacked once per session.

The GPU machine has no package index, so the wheel is downloaded elsewhere and
carried (README, "CUDA 12")::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux2014_x86_64 -d WHEELS 'nvidia-cuda-cupti-cu12==12.8.*'

Tests that use the ``cupti12`` fixture skip, saying so, where it is not set.
"""
import glob
import os
import re
import zipfile
from typing import NamedTuple

import pytest

ENV = "CD_TEST_CUPTI12_WHEEL"


class Cupti12(NamedTuple):
    lib: str            # .../nvidia/cuda_cupti/lib/libcupti.so.12
    include: str        # .../nvidia/cuda_cupti/include
    api_version: int    # CUPTI_API_VERSION of its cupti_version.h (what cuptiGetVersion says)
    wheel: str


def wheel_path():
    """The wheel $CD_TEST_CUPTI12_WHEEL names, or skip saying why."""
    where = os.environ.get(ENV)
    if not where:
        pytest.skip("%s is not set: point it at the nvidia-cuda-cupti-cu12 wheel (or a folder "
                    "holding it) to test CUDA 12's CUPTI" % ENV)
    if os.path.isdir(where):
        found = sorted(glob.glob(os.path.join(where, "nvidia_cuda_cupti_cu12-*.whl")))
        if not found:
            pytest.skip("%s=%s holds no nvidia_cuda_cupti_cu12-*.whl" % (ENV, where))
        return found[-1]
    if not os.path.isfile(where):
        pytest.skip("%s=%s: no such file" % (ENV, where))
    return where


@pytest.fixture(scope="session")
def cupti12(tmp_path_factory):
    wheel = wheel_path()
    out = str(tmp_path_factory.mktemp("cupti12"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out, [n for n in z.namelist() if n.startswith("nvidia/cuda_cupti/")])
    root = os.path.join(out, "nvidia", "cuda_cupti")
    lib = os.path.join(root, "lib", "libcupti.so.12")
    version_h = os.path.join(root, "include", "cupti_version.h")
    assert os.path.isfile(lib) and os.path.isfile(version_h), "%s: not a CUPTI 12 wheel" % wheel
    m = re.search(r"^\s*#\s*define\s+CUPTI_API_VERSION\s+(\d+)", open(version_h).read(), re.M)
    return Cupti12(lib, os.path.join(root, "include"), int(m.group(1)), wheel)
