"""cuda_debug.bench without a GPU: argument validation (ValueError before any GPU
work), the structured dtype built by the C core, statistics on known samples,
peaks, flags, the correctness measure, memory checks, table / CSV / JSON
rendering and the CLI's argument handling."""
import csv
import io
import json
import math
import sys
import types

import numpy as np
import pytest

from cuda_debug import _cli_bench, _core, bench

FAST = dict(warmup=0.0, repeats=2, loop_ms=0.1, sample_ms=0.1)


# ------------------------------------------------------------------ validation --

@pytest.mark.parametrize("size", [0, -1, "0", "-5", "12x0x4", (4, 4, 0), "abc", "4x4", 1.5,
                                  True, (4, 4), "1x2x3x4", 2 ** 31])
def test_bad_sizes_raise_valueerror(size):
    with pytest.raises(ValueError):
        bench.gemm(sizes=[size], **FAST)


def test_bad_sizes_raise_before_any_gpu_work(monkeypatch):
    def no_gpu(*a, **k):
        raise AssertionError("GPU touched before validation")
    monkeypatch.setattr(bench, "device_info", no_gpu)
    monkeypatch.setattr(bench._libraries, "ensure", no_gpu)
    for kwargs in [dict(sizes=[0]), dict(sizes=[64], dtypes=["fp64"]),
                   dict(sizes=[64], modes=["blocking"]), dict(sizes=[64], api="cublasxt"),
                   dict(sizes=[64], flags={"allow_tf33": True}),
                   dict(sizes=[64], flags={"allow_tf32": "yes"}), dict(sizes=[64], repeats=0),
                   dict(sizes=[64], warmup=-1), dict(sizes=[64], samples=0),
                   dict(sizes=[64], check="always"), dict(sizes=[64], seed=-1),
                   dict(sizes=[]), dict(sizes=[64], dtypes=[]), dict(sizes=[64], modes=[]),
                   dict(sizes=[64], device=-1)]:
        with pytest.raises(ValueError):
            bench.gemm(**kwargs)
    for kwargs in [dict(modes=["fast"]), dict(launches=0), dict(repeats=-3), dict(device=-1)]:
        with pytest.raises(ValueError):
            bench.launch_latency(**kwargs)


def test_unknown_dtype_and_mode_messages_name_the_choices():
    with pytest.raises(ValueError, match="fp32, tf32, fp16, bf16"):
        bench.gemm(sizes=[64], dtypes=["fp64"])
    with pytest.raises(ValueError, match="async, sync, scope, launch_blocking"):
        bench.gemm(sizes=[64], modes=["eager"])


def test_parse_size_forms():
    assert bench.parse_size(256) == (256, 256, 256)
    assert bench.parse_size(np.int64(128)) == (128, 128, 128)
    assert bench.parse_size("1024") == (1024, 1024, 1024)
    assert bench.parse_size(" 4096x1024X512 ".lower()) == (4096, 1024, 512)
    assert bench.parse_size((8, 16, 32)) == (8, 16, 32)
    assert bench._parse_sizes("256,1024,256") == [(256,) * 3, (1024,) * 3]
    assert bench._parse_sizes(512) == [(512,) * 3]


def test_choices_accept_strings_aliases_and_dedupe():
    assert bench._parse_choice("fp32, bfloat16,fp32", bench.DTYPES, "dtypes",
                               bench._DTYPE_ALIASES) == ["fp32", "bf16"]
    assert bench._parse_choice(["SYNC", "async"], bench.MODES, "modes") == ["sync", "async"]


# ------------------------------------------------------------------- flags --

def test_flags_default_without_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert bench.torch_flags() == bench.TORCH_DEFAULT_FLAGS
    assert bench.resolve_flags(None) == [bench.TORCH_DEFAULT_FLAGS]


def test_flags_read_from_an_imported_torch(monkeypatch):
    matmul = types.SimpleNamespace(allow_tf32=True, allow_fp16_reduced_precision_reduction=False,
                                   allow_bf16_reduced_precision_reduction=(True, False))
    fake = types.SimpleNamespace(backends=types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=matmul)))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert bench.torch_flags() == {"allow_tf32": True,
                                   "allow_fp16_reduced_precision_reduction": False,
                                   "allow_bf16_reduced_precision_reduction": True}
    # a dict fills the missing flags from the current settings
    (f,) = bench.resolve_flags({"bf16_rr": False})
    assert f["allow_tf32"] is True and f["allow_bf16_reduced_precision_reduction"] is False


def test_flags_sweep_runs_each_distinct_gemm_once(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    cfgs = bench.plan([64], ["fp32", "tf32", "fp16", "bf16"], "sweep")
    got = [(c.dtype, bench.math_bits(c.dtype, c.flags)) for c in cfgs]
    assert got == [("fp32", 0), ("fp32", 1), ("tf32", 0), ("fp16", 0), ("fp16", 2),
                   ("bf16", 0), ("bf16", 2)]
    assert all(c.flags["allow_tf32"] for c in cfgs if c.dtype == "tf32")


def test_math_bits_and_effective_dtype():
    d = dict(bench.TORCH_DEFAULT_FLAGS)
    assert bench.math_bits("fp32", d) == 0 and bench.effective_dtype("fp32", d) == "fp32"
    t = dict(d, allow_tf32=True)
    assert bench.math_bits("fp32", t) == 1 and bench.effective_dtype("fp32", t) == "tf32"
    assert bench.math_bits("bf16", t) == 0          # allow_tf32 does not touch bf16
    no_rr = dict(d, allow_fp16_reduced_precision_reduction=False)
    assert bench.math_bits("fp16", no_rr) == 2 and bench.math_bits("bf16", no_rr) == 0


# ------------------------------------------------------------- C records --

GEMM_FIELDS = ("m", "n", "k", "dtype", "mode", "api", "allow_tf32", "allow_fp16_reduced",
               "allow_bf16_reduced", "flush", "ms", "p10_ms", "p90_ms", "tflops", "pct_peak",
               "slowdown", "gpu_ms", "gpu_p10_ms", "gpu_p90_ms", "call_ms", "call_p90_ms",
               "samples", "loops", "loop_n", "rel_err", "sm_mhz")


def test_structured_dtype_from_the_c_core():
    a = _core.bench_records("gemm", [])
    assert isinstance(a, np.ndarray) and a.shape == (0,)
    assert a.dtype.names == GEMM_FIELDS
    assert a.dtype["m"] == np.dtype("<i8") and a.dtype["ms"] == np.dtype("<f8")
    assert a.dtype["dtype"].kind == "U" and a.dtype["mode"].itemsize // 4 >= len("launch_blocking")
    assert a.dtype["allow_tf32"] == np.dtype("?")
    lat = _core.bench_records("latency", [])
    assert lat.dtype.names[:4] == ("mode", "us", "p10_us", "p90_us")


def _row(**over):
    r = dict(m=1024, n=1024, k=1024, dtype="bf16", mode="async", api="gemmex", allow_tf32=False,
             allow_fp16_reduced=True, allow_bf16_reduced=True, flush=True, ms=0.0104,
             p10_ms=0.0102, p90_ms=0.0107, tflops=206.5, pct_peak=19.3, slowdown=1.0,
             gpu_ms=0.0098, gpu_p10_ms=0.0097, gpu_p90_ms=0.0099, call_ms=0.004,
             call_p90_ms=0.005, samples=50, loops=10, loop_n=1900, rel_err=math.nan,
             sm_mhz=1980.0)
    r.update(over)
    return r


def test_records_round_trip():
    rows = [_row(), _row(mode="launch_blocking", ms=0.0283, slowdown=2.72, pct_peak=math.nan)]
    a = bench.records("gemm", rows)
    assert a.shape == (2,)
    assert a["mode"].tolist() == ["async", "launch_blocking"]
    assert (a["dtype"] == "bf16").all()
    assert a["ms"][1] == pytest.approx(0.0283) and a["loop_n"][0] == 1900
    assert math.isnan(a["pct_peak"][1]) and a["flush"].all()


def test_records_reject_bad_rows():
    with pytest.raises(ValueError):
        _core.bench_records("gemm", [(1, 2, 3)])               # too few values
    with pytest.raises((TypeError, ValueError)):
        bench.records("gemm", [_row(ms="fast")])
    with pytest.raises(ValueError):
        _core.bench_records("nope", [])


# --------------------------------------------------------------- numbers --

def test_summarize_known_samples():
    med, p10, p90 = bench.summarize(range(1, 11))            # 1..10
    assert (med, p10, p90) == pytest.approx((5.5, 1.9, 9.1))
    assert bench.summarize([3.0]) == (3.0, 3.0, 3.0)
    assert bench.summarize([2.0, 1.0, 4.0, 3.0])[0] == pytest.approx(2.5)
    assert all(math.isnan(x) for x in bench.summarize([]))


def test_peak_table():
    peaks = bench.peak_tflops((9, 0), 132, 1980000)
    assert peaks["bf16"] == pytest.approx(132 * 4096 * 1.98e9 / 1e12)     # 1070.5
    assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2)
    assert peaks["fp32"] == pytest.approx(66.9, rel=1e-3)
    assert bench.peak_tflops((7, 0), 80, 1530000)["bf16"] is None        # V100: no bf16
    assert all(v is None for v in bench.peak_tflops((3, 5), 10, 1000000).values())


def test_decode_and_relative_error():
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (8, 5)).astype(np.float16)
    b = rng.uniform(-1, 1, (5, 6)).astype(np.float16)
    A, B = (bench.decode(x.view(np.uint16), "fp16") for x in (a, b))
    assert np.array_equal(A, a.astype(np.float64))
    exact = A @ B
    assert bench.relative_error(A, B, exact) == 0.0
    wrong = exact.copy()
    wrong[2, 3] += 0.5 * np.max(np.abs(A) @ np.abs(B))
    assert bench.relative_error(A, B, wrong) == pytest.approx(0.5)
    bf = np.array([0x3F80, 0xC000, 0x3E00], dtype=np.uint16)            # 1, -2, 0.125
    assert bench.decode(bf, "bf16").tolist() == [1.0, -2.0, 0.125]
    # a transposed product is far outside every tolerance
    sq = rng.uniform(-1, 1, (16, 16))
    assert bench.relative_error(sq, sq.T.copy(), sq @ sq) > max(bench.TOLERANCE.values())


def test_memory_check_names_the_problem():
    cfgs = bench.plan(["100000", 64], ["fp32"], "default")
    assert bench.memory_needed(64, 64, 64, "bf16", 0) == 3 * 64 * 64 * 2 + \
        bench.WORKSPACE_BYTES + bench._MEM_MARGIN
    with pytest.raises(ValueError, match=r"H100's memory .*100000 fp32 needs 11\d\.\d\d GiB"):
        bench.check_memory(cfgs, 80 << 30, 80 << 30, 120 << 20, "NVIDIA H100")
    bench.check_memory(cfgs[1:], 80 << 30, 80 << 30, 120 << 20)          # 64^3 fits


def test_flush_size_at_least_twice_l2():
    assert bench.flush_size(60 << 20) == 120 << 20
    assert bench.flush_size(50 * 1024 * 1024 + 1) >= 2 * (50 * 1024 * 1024 + 1)
    assert bench.flush_size(0) == 8 << 20


def test_slowdown_against_the_async_row_of_the_same_problem():
    rows = [_row(ms=0.01), _row(mode="sync", ms=0.025), _row(dtype="fp32", mode="sync", ms=1.0)]
    bench._fill_slowdown(rows)
    assert rows[0]["slowdown"] == 1.0 and rows[1]["slowdown"] == pytest.approx(2.5)
    assert math.isnan(rows[2]["slowdown"])                   # no async fp32 row


# ------------------------------------------------------------- rendering --

META = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
        "max_sm_clock_mhz": 1980, "driver": "580.159.04", "driver_cuda": "13.0",
        "cublas": "13.1.0", "flush_bytes": 120 << 20,
        "sm_clock_seen_mhz": {"min": 1755.0, "median": 1980.0, "max": 1980.0}}


def _result():
    rows = [_row(), _row(mode="sync", ms=0.025, p10_ms=0.024, p90_ms=0.026, tflops=85.9,
                         pct_peak=8.0),
            _row(mode="launch_blocking", ms=0.0283, tflops=75.9, pct_peak=7.1),
            _row(m=4096, n=2048, k=512, dtype="fp32", ms=0.5, tflops=17.2, pct_peak=25.7,
                 allow_tf32=True, rel_err=1e-4)]
    bench._fill_slowdown(rows)
    return bench.GemmResult(bench.records("gemm", rows), dict(META))


def test_table_rendering():
    text = _result().table()
    assert "NVIDIA H200 (sm_90, 132 SMs" in text and "cuBLAS 13.1.0" in text
    assert "SM clock seen 1755-1980 MHz" in text
    lines = text.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("dtype"))
    for h in ("flags", "size", "mode", "ms", "p10", "p90", "TFLOP/s", "%peak", "slowdown",
              "gpu ms", "call ms"):
        assert h in lines[head]
    body = lines[head + 2: head + 6]
    assert body[0].split()[:4] == ["bf16", "rr=on", "1024", "async"]
    assert "2.40x" in body[1] and "2.72x" in body[2]
    assert body[3].split()[:4] == ["fp32", "tf32=on", "4096x2048x512", "async"]
    assert "0.0104" in body[0] and "206.5" in body[0]
    assert "ms: wall time per GEMM" in text
    bare = _result().table(legend=False)
    assert bare.splitlines()[0].startswith("dtype")


def test_csv_rendering(tmp_path):
    res = _result()
    path = tmp_path / "g.csv"
    text = res.to_csv(str(path))
    assert path.read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(GEMM_FIELDS)
    assert len(rows) == 4
    assert rows[1]["mode"] == "sync" and float(rows[1]["slowdown"]) == pytest.approx(0.025 / 0.0104)
    assert rows[0]["rel_err"] == ""                             # NaN -> empty
    assert float(rows[3]["rel_err"]) == pytest.approx(1e-4)
    assert rows[3]["allow_tf32"] == "True"


def test_json_rendering(tmp_path):
    res = _result()
    doc = json.loads(res.to_json(str(tmp_path / "g.json")))
    assert doc["meta"]["gpu"] == "NVIDIA H200"
    assert doc["rows"][0]["rel_err"] is None and doc["rows"][3]["rel_err"] == pytest.approx(1e-4)
    assert doc["rows"][2]["mode"] == "launch_blocking"
    assert json.loads((tmp_path / "g.json").read_text()) == doc


def test_plot_needs_matplotlib_or_writes_png(tmp_path):
    res = _result()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="matplotlib"):
            res.plot(str(tmp_path / "g.png"))
        return
    res.plot(str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_table_and_csv():
    rows = [dict(mode="async", us=2.1, p10_us=2.0, p90_us=2.3, call_us=1.9, call_p10_us=1.8,
                 call_p90_us=2.5, extra_us=math.nan, slowdown=math.nan, samples=2000, loops=20,
                 loop_n=1000),
            dict(mode="sync", us=9.5, p10_us=9.3, p90_us=9.9, call_us=9.4, call_p10_us=9.2,
                 call_p90_us=10.1, extra_us=math.nan, slowdown=math.nan, samples=2000,
                 loops=20, loop_n=1000)]
    bench._fill_latency_derived(rows)
    res = bench.LatencyResult(bench.records("latency", rows), {"gpu": "NVIDIA H200"})
    text = res.table()
    assert "+7.40" in text and "4.52x" in text and "NVIDIA H200" in text
    parsed = list(csv.DictReader(io.StringIO(res.to_csv())))
    assert parsed[1]["mode"] == "sync" and float(parsed[1]["extra_us"]) == pytest.approx(7.4)


def test_results_section_is_replaced_in_place(tmp_path):
    path = str(tmp_path / "RESULTS.md")
    with open(path, "w") as f:
        f.write("# results\n\n## Other\n\nkeep me\n")
    bench.write_results_section(path, "gemm", "GEMM", "first")
    bench.write_results_section(path, "gemm", "GEMM", "second")
    text = open(path).read()
    assert "keep me" in text and "second" in text and "first" not in text
    assert text.count("## GEMM") == 1


# -------------------------------------------------------------------- CLI --

@pytest.mark.parametrize("argv", [["gemm", "--sizes", "0"], ["gemm", "--dtypes", "fp64"],
                                  ["gemm", "--modes", "eager"], ["gemm", "--flags", "tf32=2"],
                                  ["gemm", "--repeats", "x"], ["nope"], [],
                                  ["latency", "--launches", "0"]])
def test_cli_bad_arguments_exit_2(argv, capsys):
    assert _cli_bench.main(argv) == 2
    assert capsys.readouterr().err.strip()


def test_cli_help_and_bench_prefix(capsys):
    assert _cli_bench.main(["--help"]) == 0
    assert "gemm" in capsys.readouterr().out
    assert _cli_bench.main(["bench", "gemm", "--sizes", "-1"]) == 2


def test_cli_flags_argument():
    assert _cli_bench._flags_arg("sweep") == "sweep"
    assert _cli_bench._flags_arg("tf32=1,bf16_rr=off") == {"tf32": True, "bf16_rr": False}
    args = _cli_bench.parser().parse_args(["gemm", "--sizes", "256,4096x1024x512", "--no-flush",
                                           "--api", "gemmex,lt", "--json", "x.json"])
    assert args.sizes == "256,4096x1024x512" and args.flush is False and args.json == "x.json"
