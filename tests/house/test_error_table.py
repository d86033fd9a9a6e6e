"""Tests for the generated CUDA driver error table (cuda_debug/_cuda_errors.py).

CPU only: no GPU, no numpy, no built C extension.  The tests that compare
against cuda.h skip when no header is found.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
GENERATOR = REPO_ROOT / "tools" / "gen" / "cuda_errors.py"
# The table of the cuda_debug under test (this checkout's, or an installed copy's
# when tests/ runs without the source tree); finding it imports only the lazy
# package __init__, not the C extension.
TABLE = Path(importlib.util.find_spec("cuda_debug._cuda_errors").origin)

REQUIRED_STICKY = {700, 702, 710, 714, 715, 716, 717, 718, 719}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    if not GENERATOR.is_file():
        pytest.skip("the generator tools/gen/cuda_errors.py is part of the source tree, absent "
                    "here: the tests run against an installed cuda_debug (%s)" % TABLE)
    return _load("gen_cuda_errors", GENERATOR)


@pytest.fixture(scope="module")
def errors_module():
    # Loaded by path rather than `from cuda_debug import _cuda_errors`, so the
    # test does not depend on the package (or its C extension) being built.
    return _load("_cuda_errors_under_test", TABLE)


def find_cuda_h():
    """The cuda.h the build would use (cuda_debug/_cuda_headers.py), or None."""
    search = _load("_cuda_headers", TABLE.parent / "_cuda_headers.py")
    return Path(search.header("cuda.h")) if search.header("cuda.h") else None


@pytest.fixture(scope="module")
def header(gen, errors_module):
    """(path, cuda_version, errors) of a cuda.h matching the committed table."""
    path = find_cuda_h()
    if path is None:
        pytest.skip("no cuda.h found (looked in $CUDA_HOME/include, "
                    "/usr/local/cuda/include and nvidia pip wheels)")
    version, errors = gen.parse_header(path.read_text(encoding="utf-8", errors="replace"))
    if version != errors_module.CUDA_VERSION:
        pytest.skip(f"{path} is CUDA_VERSION {version}, the committed table is "
                    f"{errors_module.CUDA_VERSION}")
    return path, version, errors


# --- table vs header --------------------------------------------------------

def test_table_matches_header(gen, errors_module, header):
    _, version, errors = header
    assert errors_module.CUDA_VERSION == version
    assert errors_module.ERRORS == errors
    assert list(errors_module.ERRORS) == sorted(errors_module.ERRORS)
    assert errors_module.STICKY == gen.sticky_codes(errors)


def _run_check(header_path, out_path):
    return subprocess.run(
        [sys.executable, str(GENERATOR), "--header", str(header_path),
         "--out", str(out_path), "--check"],
        capture_output=True, text=True,
    )


def test_check_mode_accepts_committed_file(header, tmp_path):
    copy = tmp_path / "_cuda_errors.py"
    copy.write_bytes(TABLE.read_bytes())
    result = _run_check(header[0], copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def generated(gen, tmp_path):
    """(header, module, C header): a table the generator wrote into tmp_path from
    the cuda.h found, or, where there is none (no toolkit), from a synthetic one:
    what --check compares with, whatever the header."""
    path = find_cuda_h()
    if path is None:
        path = tmp_path / "cuda.h"
        path.write_text(SYNTHETIC_COMPLETE, encoding="utf-8")
    out, c_out = tmp_path / "_cuda_errors.py", tmp_path / "cuda_errors.h"
    p = subprocess.run([sys.executable, str(GENERATOR), "--header", str(path), "--out", str(out),
                        "--c-out", str(c_out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return path, out, c_out


def _check_pair(header_path, out_path, c_out_path):
    return subprocess.run(
        [sys.executable, str(GENERATOR), "--header", str(header_path), "--out", str(out_path),
         "--c-out", str(c_out_path), "--check"], capture_output=True, text=True)


def test_check_mode_rejects_tampered_file(generated):
    header_path, out, c_out = generated
    assert _check_pair(header_path, out, c_out).returncode == 0
    original = out.read_text(encoding="utf-8")
    tampered = original.replace("context cannot be used anymore", "context is fine", 1)
    assert tampered != original
    out.write_text(tampered, encoding="utf-8")

    result = _check_pair(header_path, out, c_out)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "out of date" in result.stdout
    assert out.read_text(encoding="utf-8") == tampered  # --check must not write


def test_check_mode_rejects_missing_file(generated, tmp_path):
    header_path, _, c_out = generated
    result = _check_pair(header_path, tmp_path / "absent.py", c_out)
    assert result.returncode == 1


# --- spot checks on the committed table --------------------------------------

def test_assert_is_sticky(errors_module):
    assert errors_module.name(710) == "CUDA_ERROR_ASSERT"
    assert errors_module.code_of("CUDA_ERROR_ASSERT") == 710
    assert errors_module.is_sticky(710)


def test_common_errors_are_not_sticky(errors_module):
    assert errors_module.name(0) == "CUDA_SUCCESS"
    assert errors_module.name(1) == "CUDA_ERROR_INVALID_VALUE"
    assert errors_module.name(2) == "CUDA_ERROR_OUT_OF_MEMORY"
    for code in (0, 1, 2, 999):
        assert not errors_module.is_sticky(code), code


def test_sticky_set_is_required_plus_documented(gen, errors_module):
    assert set(gen.REQUIRED_STICKY) == REQUIRED_STICKY
    documented = set(gen.EXTRA_STICKY) & set(errors_module.ERRORS)
    assert errors_module.STICKY == REQUIRED_STICKY | documented
    assert not errors_module.STICKY & set(gen.NOT_STICKY)
    assert errors_module.STICKY <= set(errors_module.ERRORS)
    # Named in the brief: ECC uncorrectable is sticky, UNKNOWN is not.
    assert errors_module.is_sticky(214)
    assert not errors_module.is_sticky(999)


def test_descriptions_are_clean(errors_module):
    for code, (name, desc) in errors_module.ERRORS.items():
        assert isinstance(code, int)
        assert name.startswith("CUDA_"), name
        assert desc, f"{code} {name} has no description"
        for artefact in ("/*", "*/", "*", "::", "\\", "  ", "\n"):
            assert artefact not in desc, f"{code} {name}: {artefact!r} in {desc!r}"
        assert desc == desc.strip()


def test_names_are_unique(errors_module):
    names = [entry[0] for entry in errors_module.ERRORS.values()]
    assert len(names) == len(set(names))
    for code, (name, _) in errors_module.ERRORS.items():
        assert errors_module.code_of(name) == code
        assert errors_module.description(code) == errors_module.ERRORS[code][1]


def test_unknown_code(errors_module):
    assert 123456 not in errors_module.ERRORS
    assert errors_module.name(123456) == "CUDA_ERROR_123456"
    desc = errors_module.description(123456)
    assert desc.startswith("unknown CUDA error 123456 (not in the CUDA ")
    major = errors_module.CUDA_VERSION // 1000
    assert f"CUDA {major}." in desc
    assert not errors_module.is_sticky(123456)
    with pytest.raises(KeyError):
        errors_module.code_of("CUDA_ERROR_NO_SUCH_THING")


def test_header_comment(errors_module):
    first = TABLE.read_text(encoding="utf-8").splitlines()[0]
    assert first == (f"# generated by tools/gen/cuda_errors.py from cuda.h CUDA_VERSION "
                     f"{errors_module.CUDA_VERSION} \u2014 do not edit")


# --- the parser on a synthetic header (runs without CUDA) ---------------------

SYNTHETIC = r"""
#define CUDA_VERSION 12345
typedef enum cudaError_enum {
    /**
     * All good; see ::cuStreamQuery() and \p stream.
     */
    CUDA_SUCCESS = 0,

    /**
     * \deprecated
     * An \e emphasised   word
     * over two lines.
     * \sa ::cuCtxDestroy
     */
    CUDA_ERROR_A = 0x10,
    CUDA_ERROR_B,          // implicit value: 17
    /**
     * While executing a kernel, boom. This leaves the process in an inconsistent
     * state.
     * \note Restart.
     */
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    /** Device assert. The context cannot be used anymore. */
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;
"""


#: a header the generator accepts whole: every required kernel fault, documented as sticky
SYNTHETIC_COMPLETE = "#define CUDA_VERSION 12345\ntypedef enum cudaError_enum {\n" + "".join(
    "    /** The kernel failed. The context cannot be used anymore. */\n    %s = %d,\n"
    % (name, code) for code, name in [
        (700, "CUDA_ERROR_ILLEGAL_ADDRESS"), (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
        (710, "CUDA_ERROR_ASSERT"), (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
        (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"), (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
        (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"), (718, "CUDA_ERROR_INVALID_PC"),
        (719, "CUDA_ERROR_LAUNCH_FAILED")]) + \
    "    /** All good. */\n    CUDA_SUCCESS = 0\n} CUresult;\n"


def test_parse_synthetic_header(gen):
    version, errors = gen.parse_header(SYNTHETIC)
    assert version == 12345
    assert list(errors) == [0, 16, 17, 700, 710, 999]
    assert errors[0] == ("CUDA_SUCCESS", "All good; see cuStreamQuery() and stream.")
    assert errors[16] == ("CUDA_ERROR_A", "An emphasised word over two lines.")
    assert errors[17] == ("CUDA_ERROR_B", "")
    assert errors[700][1] == ("While executing a kernel, boom. This leaves the process "
                              "in an inconsistent state.")
    assert gen.phrase_matches(errors) == {700, 710}


def test_sticky_codes_requires_the_kernel_faults(gen):
    _, errors = gen.parse_header(SYNTHETIC)
    with pytest.raises(AssertionError, match="702"):
        gen.sticky_codes(errors)


def test_parse_rejects_garbage(gen):
    with pytest.raises(ValueError):
        gen.parse_header("#define CUDA_VERSION 1\n")
    with pytest.raises(ValueError):
        gen.parse_header("#define CUDA_VERSION 1\ntypedef enum cudaError_enum "
                         "{ A = 0, B = 1 + } CUresult;")
