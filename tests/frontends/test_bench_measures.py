"""cuda_debug.bench on a real GPU: the timed GEMM computes the right product in
every dtype and API, rates are plausible, every mode runs, the launch_blocking
child really had CUDA_LAUNCH_BLOCKING=1, memory is checked, the CLI writes files.
Small sizes and short loops: the whole file takes seconds."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import PKG_PARENT

pytestmark = pytest.mark.gpu

FAST = dict(warmup=0.02, repeats=3, loop_ms=2.0, samples=5)


@pytest.fixture(scope="module")
def bench():
    from cuda_debug import bench
    return bench


@pytest.fixture(scope="module")
def all_modes(bench):
    return bench.gemm(sizes=[256], dtypes=["bf16"], modes=bench.BASE_MODES, check=True, **FAST)


def test_product_is_right_in_every_dtype_and_api(bench):
    res = bench.gemm(sizes=["192x160x256", 512], dtypes=bench.DTYPES, modes=["async"],
                     api=["gemmex", "lt"], flags="default", check=True, **FAST)
    assert len(res) == 2 * 4 * 2
    for r in res.rows():
        eff = "tf32" if r["dtype"] == "tf32" else r["dtype"]
        assert r["rel_err"] <= bench.TOLERANCE[eff], r
        assert r["ms"] > 0 and r["gpu_ms"] > 0 and r["call_ms"] > 0, r
    by = {(r["dtype"], r["api"], r["m"]): r for r in res.rows()}
    for api in ("gemmex", "lt"):
        # fp32 without allow_tf32 is true fp32; tf32 really ran on TF32 tensor cores
        # (at 512^3 cuBLAS picks a tensor-core kernel; TF32 rounding shows as ~1e-4)
        assert by[("fp32", api, 192)]["rel_err"] < 1e-6
        assert by[("fp32", api, 512)]["rel_err"] < 1e-6
        assert by[("tf32", api, 512)]["rel_err"] > 1e-6


def test_flags_reach_cublas(bench):
    res = bench.gemm(sizes=["100x72x40"], dtypes=["fp32", "fp16", "bf16"], modes=["async"],
                     flags="sweep", check=True, **FAST)
    rows = res.rows()
    assert len(rows) == 6
    fp32 = {r["allow_tf32"]: r for r in rows if r["dtype"] == "fp32"}
    assert fp32[False]["rel_err"] < 1e-6
    assert fp32[True]["rel_err"] <= bench.TOLERANCE["tf32"]
    assert {(r["dtype"], r["allow_bf16_reduced"] if r["dtype"] == "bf16"
             else r["allow_fp16_reduced"]) for r in rows if r["dtype"] != "fp32"} == \
        {("fp16", True), ("fp16", False), ("bf16", True), ("bf16", False)}


def test_every_mode_runs(all_modes, bench):
    rows = {r["mode"]: r for r in all_modes.rows()}
    assert set(rows) == set(bench.BASE_MODES)
    for mode, r in rows.items():
        assert r["ms"] > 0 and r["p10_ms"] <= r["ms"] <= r["p90_ms"], r
        assert r["rel_err"] <= bench.TOLERANCE["bf16"], r
        assert r["loop_n"] == rows["async"]["loop_n"] and r["samples"] == rows["async"]["samples"]
    assert rows["async"]["slowdown"] == 1.0
    # One blocking call waits for its ~10 us GEMM; an async call only enqueues it.
    # (Host time per call, not the loop's ms: robust to other processes sharing the GPU.)
    for mode in ("sync", "scope", "launch_blocking"):
        assert rows[mode]["call_ms"] > rows["async"]["call_ms"], (mode, rows)


def test_launch_blocking_child_had_the_variable(all_modes):
    assert all_modes.meta["launch_blocking_child"]["CUDA_LAUNCH_BLOCKING"] == "1"
    assert all_modes.meta["launch_blocking_child"]["pid"] != os.getpid()
    lb = [s for s in all_modes.samples if s["mode"] == "launch_blocking"]
    assert lb and all(s["child_env"] == "1" for s in lb)


def test_scope_mode_synchronised_every_gemm(all_modes):
    (s,) = [s for s in all_modes.samples if s["mode"] == "scope"]
    timed = len(s["loop_ms"]) * int(s["loop_n"]) + len(s["gpu_ms"])
    assert s["hook_syncs"] >= timed, s["hook_syncs"]


def test_metadata(all_modes):
    m = all_modes.meta
    assert m["gpu"] and m["sm_count"] > 0 and m["max_sm_clock_mhz"] > 0
    assert m["cublas"] and m["cublas"][0].isdigit()
    assert m["driver_cuda"] and m["cublas_path"]
    assert m["flush_bytes"] >= 2 * m["l2_bytes"]
    text = all_modes.table()
    assert m["gpu"] in text and "launch_blocking" in text


def test_rates_are_plausible(bench):
    res = bench.gemm(sizes=[4096], dtypes=["bf16", "fp32"], modes=["async"], warmup=0.05,
                     repeats=5, loop_ms=10.0, samples=10, check=False)
    for r in res.rows():
        if math.isfinite(r["pct_peak"]):
            # above 100% would mean the GEMM did not run; far below, it ran on the wrong path
            assert 5.0 < r["pct_peak"] < 100.0, r
        else:
            assert r["tflops"] > 1.0, r
        # back-to-back, the loop is GPU-bound at 4096^3: wall per GEMM ~ event time
        # (loosely: other test processes may share the GPU)
        assert 0.25 < r["ms"] / r["gpu_ms"] < 4.0, r


def test_too_large_for_the_gpu_is_a_valueerror(bench):
    with pytest.raises(ValueError, match="memory"):
        bench.gemm(sizes=[300000], dtypes=["fp32"], modes=["async"])


def test_launch_latency_every_mode(bench):
    res = bench.launch_latency(launches=200, repeats=5, samples=200)
    rows = {r["mode"]: r for r in res.rows()}
    assert set(rows) == set(bench.BASE_MODES)
    assert rows["async"]["us"] > 0
    for mode in ("sync", "scope", "launch_blocking"):
        assert rows[mode]["call_us"] > rows["async"]["call_us"], (mode, rows)
    assert res.meta["launch_blocking_child"]["CUDA_LAUNCH_BLOCKING"] == "1"
    assert "extra us" in res.table()


def test_cli_writes_table_json_csv(tmp_path, capsys):
    from cuda_debug.bench import _cli
    j, c = str(tmp_path / "g.json"), str(tmp_path / "g.csv")
    rc = _cli.main(["gemm", "--sizes", "128", "--dtypes", "bf16", "--modes", "async,sync",
                          "--repeats", "3", "--warmup", "0.01", "--loop-ms", "2", "--samples",
                          "5", "--json", j, "--csv", c, "-q"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "slowdown" in out and "bf16" in out
    doc = json.load(open(j))
    assert [r["mode"] for r in doc["rows"]] == ["async", "sync"]
    assert [r["mode"] for r in csv.DictReader(open(c))] == ["async", "sync"]


def test_python_m_cuda_debug_bench_latency():
    p = subprocess.run([sys.executable, "-m", "cuda_debug", "bench", "latency", "--modes",
                        "async,sync", "--launches", "100", "--repeats", "3", "--samples", "100",
                        "-q"], capture_output=True, text=True, cwd=PKG_PARENT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "us/launch" in p.stdout and "sync" in p.stdout


def test_torch_flags_are_followed_when_torch_is_imported(child):
    """In a fresh process that imported torch first (bench shares its cuBLAS):
    flags=None reads torch.backends.cuda.matmul, so allow_tf32=True means TF32."""
    pytest.importorskip("torch")
    c = child("""
        import torch
        torch.backends.cuda.matmul.allow_tf32 = True
        from cuda_debug import bench
        res = bench.gemm(sizes=[512], dtypes=["fp32"], modes=["async"], check=True,
                         warmup=0.02, repeats=3, loop_ms=2.0, samples=5)
        (r,) = res.rows()
        report(dict(allow_tf32=bool(r["allow_tf32"]), rel_err=float(r["rel_err"])))
    """)
    assert c.result is not None, c
    assert c.result["allow_tf32"] and c.result["rel_err"] > 1e-6, c.result


def test_samples_are_numpy_arrays_owning_the_c_buffer(bench):
    from cuda_debug import _core, _libraries
    from cuda_debug.bench import _gemm
    _libraries.ensure(_libraries.CUBLAS)
    cfg = bench.plan([64], ["bf16"], "default")[0]
    opts = dict(flush_bytes=0, warmup=0.0, samples=4, sample_ms=1.0, max_samples=4,
                repeats=3, loop_ms=1.0, seed=0, lt_algos=1)
    out = _core.gemm(**_gemm.c_kwargs(cfg, 0, opts, None, False, False))
    assert out[0] == 0, out
    gpu, loop = out[2], out[4]
    assert gpu.dtype == "float64" and gpu.shape == (4,) and loop.shape == (3,)
    assert type(gpu.base).__name__ == "PyCapsule" and not gpu.flags.owndata
    assert (loop > 0).all()


def test_lt_heuristic_choice_and_timed_choice(bench):
    res = bench.gemm(sizes=[512], dtypes=["bf16"], modes=["async"], api="lt", check=True,
                     **FAST)
    res2 = bench.gemm(sizes=[512], dtypes=["bf16"], modes=["async"], api="lt", check=True,
                      lt_algos=4, **FAST)
    assert res.samples[0]["lt_tried"] == 0
    assert 0 <= res2.samples[0]["lt_tried"] <= 4      # 0 when the heuristic offers one
    assert res2.rows()[0]["rel_err"] <= bench.TOLERANCE["bf16"]
