"""csrc/base/cuda_api.h, the CUDA declarations the build uses instead of a
toolkit: generated from the real headers and current, and of the same ABI.

The probes come from tools/gen/cuda_api.py: abi_probe.c prints the size,
alignment and field offsets of every struct, the size and signedness of every
type, the value of every enumerator and the expansion of every macro of the
header; it is compiled against the real headers (found by
cuda_debug/_cuda_headers.py) and against ours, and the outputs must be equal.
redeclare.c redeclares our prototypes, typedefs and macros after the real
headers: the compiler refuses any that differs. Skipped where no CUDA headers
(or no C compiler) are found: the build itself needs neither those headers nor
these tests.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import need_source_tree
from cuda12_wheel import cupti12  # noqa: F401  (fixture)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cc():
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    return cc


@pytest.fixture(scope="module")
def gen():
    root = need_source_tree("tools/gen/cuda_api.py")
    return _load("gen_cuda_api", os.path.join(root, "tools", "gen", "cuda_api.py"))


@pytest.fixture(scope="module")
def real(gen):
    """(include dirs, model) of the real headers, when they are the version
    cuda_api.h was generated from."""
    search = _load("_cuda_headers", os.path.join(gen.REPO_ROOT, "cuda_debug", "_cuda_headers.py"))
    dirs, tried = search.find(gen.HEADERS)
    if not dirs:
        pytest.skip("no CUDA headers (%s) found together (cuda_debug/_cuda_headers.py looked in %s)"
                    % (", ".join(gen.HEADERS), ", ".join(tried)))
    _cc()
    model = gen.build_model(dirs)
    ours = open(gen.DEFAULT_OUT, encoding="utf-8").readline()
    stamp = gen.versions(model.macros)
    if stamp not in ours:
        pytest.skip("the headers in %s are %s; csrc/base/cuda_api.h was generated from others: %s"
                    % (dirs, stamp, ours.strip()))
    return dirs, model


def _run_probe(cc, src_dir, flags, tmp_path, name):
    exe = str(tmp_path / name)
    p = subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", "-o", exe,
                        os.path.join(src_dir, "abi_probe.c")] + flags,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return subprocess.run([exe], capture_output=True, text=True, check=True, timeout=30).stdout


@pytest.fixture(scope="module")
def probes(gen, real, tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_api_probe")
    (d / "abi_probe.c").write_text(gen.probe_source(real[1]))
    (d / "redeclare.c").write_text(gen.redeclaration_source(real[1]))
    return d


def test_header_is_current(gen, real):
    """csrc/base/cuda_api.h is what the generator makes of these headers and of
    what csrc/ names today (a new driver call: rerun the generator)."""
    p = subprocess.run([sys.executable, os.path.join(gen.REPO_ROOT, "tools", "gen", "cuda_api.py"),
                        "--check"] + ["--include=" + d for d in real[0]], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "up to date (CUDA_VERSION " in p.stdout


def test_abi_is_the_real_headers_abi(gen, real, probes, tmp_path):
    cc = _cc()
    csrc = os.path.join(gen.REPO_ROOT, "csrc")
    theirs = _run_probe(cc, probes, ["-DCD_PROBE_REAL"] + ["-I" + d for d in real[0]], tmp_path, "real")
    ours = _run_probe(cc, probes, ["-I" + csrc], tmp_path, "ours")
    assert ours == theirs
    lines = ours.splitlines()
    keys = {" ".join(line.split()[:2]) for line in lines}
    # What the launch callback reads of CUPTI's records, every id it enables.
    for key in ("size CUpti_CallbackData", "offset CUpti_CallbackData.functionParams",
                "offset CUpti_CallbackData.symbolName", "offset CUpti_CallbackData.context",
                "size CUpti_SubscriberParams", "macro CUpti_SubscriberParams_STRUCT_SIZE",
                "offset cuLaunchKernel_params.hStream", "offset cuLaunchKernelEx_params.config",
                "offset CUlaunchConfig.hStream", "offset CUlaunchConfig.blockDimZ",
                "offset cuGraphLaunch_params.hStream", "size cublasLtMatmulHeuristicResult_t",
                "macro CUDA_VERSION", "macro CUPTI_API_VERSION", "macro cuMemAlloc",
                "macro CU_STREAM_PER_THREAD", "enum CUDA_SUCCESS", "enum CUDA_ERROR_NOT_READY"):
        assert key in keys, key
    ids = re.findall(r"X\((CUPTI_DRIVER_TRACE_CBID_\w+),",
                     open(os.path.join(csrc, "base", "cupti_ids.h"), encoding="utf-8").read())
    assert len(ids) >= 16
    for cbid in ids:
        assert "enum " + cbid in keys, cbid
    assert len(lines) > 300


def test_prototypes_typedefs_and_macros_are_the_real_ones(real, probes):
    cc = _cc()
    p = subprocess.run([cc, "-std=gnu11", "-Werror", "-fsyntax-only",
                        str(probes / "redeclare.c")] + ["-I" + d for d in real[0]],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    text = (probes / "redeclare.c").read_text()
    for needle in ("CUresult cuMemAlloc_v2(", "CUptiResult cuptiSubscribe_v2(",
                   "typedef void (*CUpti_CallbackFunc)(", "cublasStatus_t cublasLtMatmul(",
                   "#define cuMemAlloc cuMemAlloc_v2"):
        assert needle in text, needle


def test_the_checks_catch_a_difference(gen, real, probes, tmp_path):
    """A header one enumerator or one field type off fails the comparison, and
    a prototype one parameter off fails the redeclaration."""
    cc = _cc()
    header = open(gen.DEFAULT_OUT, encoding="utf-8").read()
    m = re.search(r"(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel = )(\d+)", header)
    mutant = header.replace(m.group(0), m.group(1) + str(int(m.group(2)) + 1))
    at = mutant.index("typedef struct cuLaunchKernel_params_st {")
    field = mutant.index("unsigned int gridDimX;", at)
    mutant = mutant[:field] + "size_t gridDimX;" + mutant[field + len("unsigned int gridDimX;"):]
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "cuda_api.h").write_text(mutant)
    ours = _run_probe(cc, probes, ["-I" + str(tmp_path)], tmp_path, "mutant").splitlines()
    theirs = _run_probe(cc, probes, ["-DCD_PROBE_REAL"] + ["-I" + d for d in real[0]],
                        tmp_path, "real").splitlines()
    differ = {a.rsplit(" ", 1)[0] for a, b in zip(ours, theirs) if a != b}
    assert "enum CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel" in differ
    assert "offset cuLaunchKernel_params.gridDimY" in differ
    assert "offset cuLaunchKernel_params.f" not in differ

    redecl = (probes / "redeclare.c").read_text()
    assert "CUresult cuInit(unsigned int Flags);" in redecl
    (tmp_path / "redeclare.c").write_text(redecl.replace("CUresult cuInit(unsigned int Flags);",
                                                         "CUresult cuInit(long Flags);"))
    p = subprocess.run([cc, "-std=gnu11", "-Werror", "-fsyntax-only", str(tmp_path / "redeclare.c")]
                       + ["-I" + d for d in real[0]], capture_output=True, text=True)
    assert p.returncode != 0 and "cuInit" in p.stderr, p.stderr


def test_csrc_reads_no_cuda_header():
    """Every C file of csrc/ compiles with no CUDA header reachable, and reads
    cuda_api.h where it needs CUDA declarations (the dependencies the compiler
    lists)."""
    root = need_source_tree("csrc/")
    cc = _cc()
    try:
        import numpy
    except ImportError:
        pytest.skip("no NumPy headers")
    sources = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in
                     os.walk(os.path.join(root, "csrc")) for f in fs if f.endswith(".c"))
    env = {k: v for k, v in os.environ.items() if k not in ("CPATH", "C_INCLUDE_PATH", "CUDA_HOME")}
    readers = 0
    for rel in sources:
        p = subprocess.run([cc, "-std=gnu11", "-M", "-Icsrc", "-I" + sysconfig.get_paths()["include"],
                            "-I" + numpy.get_include(), rel], capture_output=True, text=True,
                           cwd=root, env=env)
        assert p.returncode == 0, "%s: %s" % (rel, p.stderr)
        deps = p.stdout.replace("\\\n", " ").split()[1:]
        cuda = [d for d in deps if not d.startswith("csrc/") and
                re.search(r"/(cuda|cupti\w*|cublas\w*|driver_types|generated_cuda_meta)\.h$", d)]
        assert not cuda, "%s reads %s" % (rel, cuda)
        readers += "csrc/base/cuda_api.h" in deps
    assert readers >= len(sources) - 2, "cuda_api.h is read by %d of %d files" % (readers, len(sources))


def test_cupti12_agrees_with_what_the_callback_reads(gen, real, probes, cupti12, tmp_path):
    """CUDA 12's CUPTI headers (the nvidia-cuda-cupti-cu12 wheel's, with the
    CUDA 13 cuda.h) give every struct, callback id and constant of cuda_api.h
    the same layout and value, but for the CUPTI version, what only CUPTI 13
    has (cuptiSubscribe_v2's CUpti_SubscriberParams, used where present; the callback
    id of cuCtxSynchronize_v2, enabled where CUPTI has it) and the
    number of callback ids of each domain (the *_SIZE enumerators: the fake
    driver sizes its tables with them; CUPTI 13 has more ids)."""
    cc = _cc()
    src = tmp_path / "abi_probe.c"
    only13 = ("CUpti_SubscriberParams", "CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2")
    src.write_text("\n".join(line for line in (probes / "abi_probe.c").read_text().splitlines()
                             if not any(name in line for name in only13)) + "\n")
    csrc = os.path.join(gen.REPO_ROOT, "csrc")
    twelve = _run_probe(cc, tmp_path, ["-DCD_PROBE_REAL", "-I" + cupti12.include] +
                        ["-I" + d for d in real[0]], tmp_path, "real12").splitlines()
    ours = _run_probe(cc, tmp_path, ["-I" + csrc], tmp_path, "ours").splitlines()
    assert len(twelve) == len(ours) > 300
    differ = {a.rsplit(" ", 1)[0]: (a, b) for a, b in zip(ours, twelve) if a != b}
    assert set(differ) == {"macro CUPTI_API_VERSION", "macro CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN",
                           "enum CUPTI_DRIVER_TRACE_CBID_SIZE", "enum CUPTI_CBID_RESOURCE_SIZE"}, \
        differ
    for size in ("enum CUPTI_DRIVER_TRACE_CBID_SIZE", "enum CUPTI_CBID_RESOURCE_SIZE"):
        assert int(differ[size][0].split()[-1]) >= int(differ[size][1].split()[-1]), differ
    assert differ["macro CUPTI_API_VERSION"][1] == "macro CUPTI_API_VERSION %d" % cupti12.api_version
