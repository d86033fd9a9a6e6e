"""cuda_debug.bench without a GPU: argument validation (before any GPU work),
the C core's strict keyword interface, the schema and result objects built from
fake sample arrays, table / CSV / JSON / plot, the progress line, the
CUDA_LAUNCH_BLOCKING=1 child protocol and the CLI's checks."""
import csv
import importlib.util
import io
import json
import math
import sys
import types

import numpy as np
import pytest

from cuda_debug import _core, bench
from cuda_debug.bench import _child, _cli, _config, _gemm, _native, _progress, _results

FAST = dict(warmup=0.0, repeats=2, loop_ms=0.1, sample_ms=0.1)


@pytest.fixture
def no_gpu(monkeypatch):
    """Any GPU work fails the test."""
    def touched(*a, **k):
        raise AssertionError("GPU touched before validation")
    monkeypatch.setattr(_native, "device_info", touched)
    monkeypatch.setattr(bench._gemm._libraries, "ensure", touched)
    monkeypatch.setattr(_core, "gemm", touched)
    monkeypatch.setattr(_core, "launch_latency", touched)


# ------------------------------------------------------------------ validation --

@pytest.mark.parametrize("size", [0, -1, "0", "-5", "12x0x4", (4, 4, 0), "abc", "4x4", 1.5,
                                  True, (4, 4), "1x2x3x4", 2 ** 31])
def test_bad_sizes_raise_valueerror(size, no_gpu):
    with pytest.raises(ValueError):
        bench.gemm(sizes=[size], **FAST)


@pytest.mark.parametrize("kwargs", [
    dict(sizes=[0]), dict(sizes=[64], dtypes=["fp64"]), dict(sizes=[64], modes=["blocking"]),
    dict(sizes=[64], api="cublasxt"), dict(sizes=[64], flags={"allow_tf33": True}),
    dict(sizes=[64], repeats=0), dict(sizes=[64], warmup=-1), dict(sizes=[64], samples=0),
    dict(sizes=[64], seed=-1), dict(sizes=[]), dict(sizes=[64], dtypes=[]),
    dict(sizes=[64], modes=[]), dict(sizes=[64], device=-1), dict(sizes=[64], lt_algos=0),
    dict(sizes=[64], flags="everything")])
def test_bad_arguments_raise_valueerror_before_any_gpu_work(kwargs, no_gpu):
    with pytest.raises(ValueError):
        bench.gemm(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(flags={"allow_tf32": "yes"}), dict(flags={"allow_tf32": 1}),
    dict(flags=[{"bf16_rr": None}]), dict(flush="yes"), dict(check="always"), dict(check=1)])
def test_non_bool_flags_raise_typeerror(kwargs, no_gpu):
    with pytest.raises(TypeError, match="True or False"):
        bench.gemm(sizes=[64], **kwargs)


@pytest.mark.parametrize("bench_call", ["gemm", "launch_latency"])
@pytest.mark.parametrize("progress", ["yes", 1, 0.5, [True]])
def test_bad_progress_is_refused_before_any_gpu_work(bench_call, progress, no_gpu):
    kwargs = dict(sizes=[64]) if bench_call == "gemm" else {}
    with pytest.raises(TypeError, match=r"^progress=.*: expected None .*True, False or a "
                                        r"callable\(done, total, text\)$"):
        getattr(bench, bench_call)(progress=progress, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(modes=["fast"]), dict(launches=0), dict(repeats=-3),
                                    dict(device=-1), dict(samples=1.5)])
def test_latency_bad_arguments(kwargs, no_gpu):
    with pytest.raises(ValueError):
        bench.launch_latency(**kwargs)


def test_unknown_dtype_and_mode_messages_name_the_choices(no_gpu):
    with pytest.raises(ValueError, match="fp32, tf32, fp16, bf16"):
        bench.gemm(sizes=[64], dtypes=["fp64"])
    with pytest.raises(ValueError, match="async, sync, scope, launch_blocking"):
        bench.gemm(sizes=[64], modes=["eager"])
    with pytest.raises(ValueError, match=r"size '12y4'"):
        bench.gemm(sizes="12y4")


def test_watch_mode_only_where_cuda_debug_watch_exists(no_gpu, monkeypatch):
    monkeypatch.setattr(_config, "watch_available", lambda: False)
    with pytest.raises(ValueError, match="cuda_debug.watch is not available"):
        bench.gemm(sizes=[64], modes=["async", "watch"])
    monkeypatch.setattr(_config, "watch_available", lambda: True)
    assert _config.parse_modes("watch,async") == ["watch", "async"]


def test_parse_size_forms():
    assert bench.parse_size(256) == (256, 256, 256)
    assert bench.parse_size(np.int64(128)) == (128, 128, 128)
    assert bench.parse_size("1024") == (1024, 1024, 1024)
    assert bench.parse_size(" 4096x1024X512 ".lower()) == (4096, 1024, 512)
    assert bench.parse_size((8, 16, 32)) == (8, 16, 32)
    assert _config.parse_sizes("256,1024,256") == [(256,) * 3, (1024,) * 3]
    assert _config.parse_sizes(512) == [(512,) * 3]


def test_choices_accept_strings_aliases_and_dedupe():
    assert _config.parse_choice("fp32, bfloat16,fp32", bench.DTYPES, "dtypes",
                                _config.DTYPE_ALIASES) == ["fp32", "bf16"]
    assert _config.parse_choice(["SYNC", "async"], bench.MODES, "modes") == ["sync", "async"]


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
    (f,) = bench.resolve_flags({"bf16_rr": False})
    assert f["allow_tf32"] is True and f["allow_bf16_reduced_precision_reduction"] is False


def test_flags_sweep_runs_each_distinct_gemm_once(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    cfgs = bench.plan([64], ["fp32", "tf32", "fp16", "bf16"], "sweep")
    got = [(c.dtype, _config.cublas_math(c.dtype, c.flags)) for c in cfgs]
    off, tf, no_rr = ({"tf32": False, "disallow_reduced": False},
                      {"tf32": True, "disallow_reduced": False},
                      {"tf32": False, "disallow_reduced": True})
    assert got == [("fp32", off), ("fp32", tf), ("tf32", tf), ("fp16", off), ("fp16", no_rr),
                   ("bf16", off), ("bf16", no_rr)]


def test_the_tf32_rule_and_reduced_reduction():
    d = dict(bench.TORCH_DEFAULT_FLAGS)
    assert bench.effective_dtype("fp32", d) == "fp32"
    t = dict(d, allow_tf32=True)
    assert bench.effective_dtype("fp32", t) == "tf32" and bench.effective_dtype("tf32", d) == "tf32"
    assert _config.cublas_math("bf16", t) == {"tf32": False, "disallow_reduced": False}
    no_rr = dict(d, allow_fp16_reduced_precision_reduction=False)
    assert _config.cublas_math("fp16", no_rr)["disallow_reduced"] is True
    assert _config.cublas_math("bf16", no_rr)["disallow_reduced"] is False
    assert _config.cublas_math("fp32", no_rr)["disallow_reduced"] is False


# ------------------------------------------------------- the C interface --

def test_element_sizes_come_from_the_c_table():
    assert _core.gemm_types() == (("fp32", 4), ("fp16", 2), ("bf16", 2))
    assert [_config.element_bytes(d) for d in bench.DTYPES] == [4, 4, 2, 2]
    assert _config.STORAGE_TYPES["bf16"] == (2, 2)


def test_c_functions_take_every_keyword_and_no_default():
    with pytest.raises(TypeError, match="keyword arguments only"):
        _core.gemm(64, 64, 64)
    with pytest.raises(TypeError):
        _core.gemm(m=64, n=64, k=64)
    with pytest.raises(TypeError):
        _core.launch_latency(device=0)
    with pytest.raises(TypeError, match="keyword arguments only"):
        _core.launch_latency(0, False, 1, 1, 1, 0.0)


def test_python_passes_every_c_argument():
    """c_kwargs is complete: the C parser accepts it and only the range check
    (device 64 is past the table) refuses it, before any CUDA call."""
    cfg = bench.plan([64], ["tf32"], "default")[0]
    opts = dict(flush_bytes=0, warmup=0.0, samples=None, sample_ms=1.0, max_samples=5,
                repeats=2, loop_ms=1.0, seed=0, lt_algos=1)
    kw = _gemm.c_kwargs(cfg, 64, opts, None, False, False)
    assert kw["tf32"] is True and kw["storage"] == 0 and kw["disallow_reduced"] is False
    with pytest.raises(ValueError, match="argument out of range"):
        _core.gemm(**kw)
    with pytest.raises(ValueError, match="argument out of range"):
        _core.launch_latency(device=64, sync_each=False, samples=1, repeats=1, loop_n=1,
                             warmup_s=0.0)


def test_no_record_building_in_c():
    assert not hasattr(_core, "bench_records")


# ------------------------------------------------------------------ schema --

GEMM_FIELDS = ("m", "n", "k", "dtype", "mode", "api", "allow_tf32", "allow_fp16_reduced",
               "allow_bf16_reduced", "flush", "ms", "p10_ms", "p90_ms", "tflops", "pct_peak",
               "slowdown", "gpu_ms", "gpu_p10_ms", "gpu_p90_ms", "call_ms", "call_p90_ms",
               "samples", "loops", "loop_n", "rel_err", "sm_mhz")


def test_schema_is_defined_in_python():
    a = _results.records("gemm", [])
    assert isinstance(a, np.ndarray) and a.shape == (0,) and a.dtype.names == GEMM_FIELDS
    assert a.dtype["m"] == np.dtype("<i8") and a.dtype["ms"] == np.dtype("<f8")
    assert a.dtype["mode"].itemsize // 4 >= len("launch_blocking")
    assert _results.records("latency", []).dtype.names[:4] == ("mode", "us", "p10_us", "p90_us")
    with pytest.raises(ValueError):
        _results.records("nope", [])


def _row(**over):
    r = dict(m=1024, n=1024, k=1024, dtype="bf16", mode="async", api="gemmex", allow_tf32=False,
             allow_fp16_reduced=True, allow_bf16_reduced=True, flush=True, ms=0.0104,
             p10_ms=0.0102, p90_ms=0.0107, tflops=206.5, pct_peak=19.3, slowdown=1.0,
             gpu_ms=0.0098, gpu_p10_ms=0.0097, gpu_p90_ms=0.0099, call_ms=0.004,
             call_p90_ms=0.005, samples=50, loops=10, loop_n=1900, rel_err=math.nan,
             sm_mhz=1980.0)
    r.update(over)
    return r


def test_records_round_trip_and_reject_bad_rows():
    a = _results.records("gemm", [_row(), _row(mode="launch_blocking", ms=0.0283)])
    assert a["mode"].tolist() == ["async", "launch_blocking"] and (a["dtype"] == "bf16").all()
    assert a["ms"][1] == pytest.approx(0.0283) and a["loop_n"][0] == 1900
    with pytest.raises((TypeError, ValueError)):
        _results.records("gemm", [_row(ms="fast")])
    bad = _row()
    del bad["ms"]
    with pytest.raises(KeyError):
        _results.records("gemm", [bad])


def _raw(loop_ms, gpu_ms=(0.01,) * 5, call_ms=(0.004,) * 5, loop_n=100, **extra):
    """Fake raw samples, as the C core returns them (float64 arrays)."""
    return dict(loop_ms=np.asarray(loop_ms, dtype=np.float64),
                gpu_ms=np.asarray(gpu_ms, dtype=np.float64),
                call_ms=np.asarray(call_ms, dtype=np.float64), loop_n=loop_n, **extra)


def test_result_array_built_from_fake_sample_arrays():
    cfg = bench.plan([1024], ["bf16"], "default")[0]
    big = bench.plan(["2048x1024x512"], ["fp32"], {"allow_tf32": True})[0]
    peaks = _config.peak_tflops((9, 0), 132, 1980000)
    meta = {"flush_bytes": 120 << 20, "peak_tflops": peaks}
    runs = [(cfg, "launch_blocking", _raw([0.030, 0.028, 0.029])),
            (cfg, "async", _raw([0.011, 0.010, 0.012, 0.010, 0.010], sm_mhz=1980.0,
                                rel_err=1e-3)),
            (big, "sync", _raw([1.0, 1.1], gpu_ms=[0.9] * 3, sm_mhz=1755.0)),
            (cfg, "sync", _raw([0.020])), (big, "async", _raw([0.5, 0.5]))]
    res = _results.build_gemm_result(runs, meta)
    rows = res.rows()
    assert [(r["dtype"], r["mode"]) for r in rows] == [
        ("bf16", "async"), ("bf16", "sync"), ("bf16", "launch_blocking"),
        ("fp32", "async"), ("fp32", "sync")]
    a = rows[0]
    assert a["ms"] == pytest.approx(0.010) and a["loops"] == 5 and a["samples"] == 5
    assert a["p10_ms"] == pytest.approx(0.010) and a["p90_ms"] == pytest.approx(0.0116)
    assert a["tflops"] == pytest.approx(2 * 1024 ** 3 / 0.010e-3 / 1e12)
    assert a["pct_peak"] == pytest.approx(100 * a["tflops"] / peaks["bf16"])
    assert a["rel_err"] == 1e-3 and a["slowdown"] == 1.0 and a["flush"]
    assert rows[2]["slowdown"] == pytest.approx(0.029 / 0.010)
    assert rows[4]["ms"] == pytest.approx(1.05) and rows[4]["slowdown"] == pytest.approx(2.1)
    assert rows[4]["pct_peak"] == pytest.approx(100 * rows[4]["tflops"] / peaks["tf32"])
    assert math.isnan(rows[3]["sm_mhz"]) and math.isnan(rows[3]["rel_err"])
    assert res.meta["sm_clock_seen_mhz"] == {"min": 1755.0, "median": 1867.5, "max": 1980.0}
    assert [s["mode"] for s in res.samples] == [r["mode"] for r in rows]


def test_latency_result_from_fake_samples():
    runs = [("sync", dict(loop_us=np.array([9.5, 9.3, 9.9]), call_us=np.array([9.4] * 4),
                          loop_n=1000)),
            ("async", dict(loop_us=np.array([2.1, 2.0, 2.3]), call_us=np.array([1.9] * 4),
                           loop_n=1000))]
    res = _results.build_latency_result(runs, {"gpu": "NVIDIA H200"})
    rows = res.rows()
    assert [r["mode"] for r in rows] == ["async", "sync"]
    assert rows[1]["extra_us"] == pytest.approx(7.4) and rows[1]["slowdown"] == pytest.approx(
        9.5 / 2.1)
    text = res.table()
    assert "+7.40" in text and "4.52x" in text and "NVIDIA H200" in text
    parsed = list(csv.DictReader(io.StringIO(res.to_csv())))
    assert parsed[1]["mode"] == "sync" and float(parsed[1]["extra_us"]) == pytest.approx(7.4)


# --------------------------------------------------------------- numbers --

def test_summarize_known_samples():
    assert bench.summarize(range(1, 11)) == pytest.approx((5.5, 1.9, 9.1))
    assert bench.summarize([3.0]) == (3.0, 3.0, 3.0)
    assert all(math.isnan(x) for x in bench.summarize([]))


def test_peak_table():
    peaks = _config.peak_tflops((9, 0), 132, 1980000)
    assert peaks["bf16"] == pytest.approx(132 * 4096 * 1.98e9 / 1e12)
    assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2)
    assert peaks["fp32"] == pytest.approx(66.9, rel=1e-3)
    assert _config.peak_tflops((7, 0), 80, 1530000)["bf16"] is None


def test_decode_and_relative_error():
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (8, 5)).astype(np.float16)
    b = rng.uniform(-1, 1, (5, 6)).astype(np.float16)
    A, B = (_results.decode(x.view(np.uint16), "fp16") for x in (a, b))
    assert np.array_equal(A, a.astype(np.float64))
    exact = A @ B
    assert _results.relative_error(A, B, exact) == 0.0
    wrong = exact.copy()
    wrong[2, 3] += 0.5 * np.max(np.abs(A) @ np.abs(B))
    assert _results.relative_error(A, B, wrong) == pytest.approx(0.5)
    bf = np.array([0x3F80, 0xC000, 0x3E00], dtype=np.uint16)            # 1, -2, 0.125
    assert _results.decode(bf, "bf16").tolist() == [1.0, -2.0, 0.125]


def test_wrong_product_is_refused():
    cfg = bench.plan([8], ["fp32"], "default")[0]
    a = np.ones((8, 8), np.float32)
    assert _gemm.check_product(cfg, (a, a, a @ a), "async") == 0.0
    with pytest.raises(RuntimeError, match="wrong product"):
        _gemm.check_product(cfg, (a, a, a), "async")
    assert math.isnan(_gemm.check_product(cfg, None, "async"))


def test_memory_check_names_the_problem():
    cfgs = bench.plan(["100000", 64], ["fp32"], "default")
    assert _config.memory_needed(64, 64, 64, "bf16", 0) == 3 * 64 * 64 * 2 + \
        bench.WORKSPACE_BYTES + _config.MEM_MARGIN
    with pytest.raises(ValueError, match=r"H100's memory .*100000 fp32 needs 11\d\.\d\d GiB"):
        _config.check_memory(cfgs, 80 << 30, 80 << 30, 120 << 20, "NVIDIA H100")
    _config.check_memory(cfgs[1:], 80 << 30, 80 << 30, 120 << 20)


def test_flush_size_at_least_twice_l2():
    assert _config.flush_size(60 << 20) == 120 << 20
    assert _config.flush_size(0) == 8 << 20


# ------------------------------------------------------------- rendering --

META = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
        "max_sm_clock_mhz": 1980, "driver": "580.159.04", "driver_cuda": "13.0",
        "cublas": "13.1.0", "flush_bytes": 120 << 20,
        "sm_clock_seen_mhz": {"min": 1755.0, "median": 1980.0, "max": 1980.0}}


def _result():
    rows = [_row(), _row(mode="sync", ms=0.025, tflops=85.9, pct_peak=8.0),
            _row(mode="launch_blocking", ms=0.0283, tflops=75.9, pct_peak=7.1),
            _row(m=4096, n=2048, k=512, dtype="fp32", ms=0.5, tflops=17.2, pct_peak=25.7,
                 allow_tf32=True, rel_err=1e-4)]
    _results.fill_slowdown(rows)
    return bench.GemmResult(_results.records("gemm", rows), dict(META))


def test_table_rendering():
    text = _result().table()
    assert "NVIDIA H200 (sm_90, 132 SMs" in text and "cuBLAS 13.1.0" in text
    lines = text.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("dtype"))
    body = lines[head + 2: head + 6]
    assert body[0].split()[:4] == ["bf16", "rr=on", "1024", "async"]
    assert "2.40x" in body[1] and "2.72x" in body[2]
    assert body[3].split()[:4] == ["fp32", "tf32=on", "4096x2048x512", "async"]
    assert _result().table(legend=False).splitlines()[0].startswith("dtype")


def test_csv_and_json_rendering(tmp_path):
    res = _result()
    text = res.to_csv(str(tmp_path / "g.csv"))
    assert (tmp_path / "g.csv").read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(GEMM_FIELDS) and len(rows) == 4
    assert rows[0]["rel_err"] == "" and float(rows[3]["rel_err"]) == pytest.approx(1e-4)
    doc = json.loads(res.to_json(str(tmp_path / "g.json")))
    assert doc["meta"]["gpu"] == "NVIDIA H200" and doc["rows"][0]["rel_err"] is None
    assert json.loads((tmp_path / "g.json").read_text()) == doc


def test_plot_needs_matplotlib_or_writes_png(tmp_path):
    res = _result()
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(ImportError, match="matplotlib"):
            res.plot(str(tmp_path / "g.png"))
        return
    res.plot(str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------- progress --

class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_line_format():
    assert _progress.format_duration(9.4) == "9s"
    assert _progress.format_duration(65) == "1m05s"
    assert _progress.format_duration(7380) == "2h03m"
    assert _progress.format_duration(None) == "?"
    assert _progress.eta_seconds(0, 10, 5.0) is None
    assert _progress.eta_seconds(2, 10, 10.0) == pytest.approx(40.0)
    line = _progress.format_line(2, 10, "gemm bf16 rr=on 4096 scope", 10.0)
    assert line == "[3/10] gemm bf16 rr=on 4096 scope | 10s, ETA 40s"
    assert _progress.format_line(0, 4, "x", 1.0).endswith("ETA ?")
    assert len(_progress.format_line(2, 10, "y" * 200, 10.0, width=40)) == 40
    assert _progress.format_line(4, 4, "", 61).startswith("[4/4] done in 1m01s")


def test_progress_on_a_terminal_rewrites_one_line():
    s = _Stream(tty=True)
    p = _progress.Progress(2, None, stream=s, prefix="gemm ")
    p.show("bf16 1024 async")
    p.step()
    p.show("bf16 1024 sync")
    p.step()
    p.close()
    out = s.getvalue()
    assert out.count("\n") == 1 and out.endswith("\n") and out.count("\r") == 3
    assert "[1/2] gemm bf16 1024 async" in out and "[2/2] gemm bf16 1024 sync" in out
    assert "ETA" in out and "done in" in out


def test_progress_off_when_piped_unless_forced():
    s = _Stream(tty=False)
    p = _progress.Progress(1, None, stream=s)
    p.show("x")
    p.step()
    p.close()
    assert s.getvalue() == ""
    s = _Stream(tty=False)
    p = _progress.Progress(1, True, stream=s)
    p.show("x")
    p.step()
    p.close()
    assert "\r" not in s.getvalue() and "[1/1] x" in s.getvalue()
    s = _Stream(tty=True)
    p = _progress.Progress(1, False, stream=s)
    p.show("x")
    p.close()
    assert s.getvalue() == ""


def test_progress_callback_and_notebook(monkeypatch):
    seen = []
    p = _progress.Progress(2, lambda d, t, text: seen.append((d, t, text)), prefix="gemm ")
    p.show("a")
    p.step()
    p.step("b")
    assert seen == [(1, 2, "gemm a"), (2, 2, "gemm b")]
    shell = type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert _progress.in_notebook()
    assert _progress.Progress(1, None, stream=_Stream(tty=False)).enabled


# ------------------------------------------------------------------- child --

def test_child_reports_errors_and_the_variable(monkeypatch):
    events = []
    with pytest.raises(ValueError, match="in the CUDA_LAUNCH_BLOCKING=1 child: .*unknown child"):
        _child.run({"kind": "nope"}, lambda e, t: events.append(e))
    assert _child.environment()["CUDA_LAUNCH_BLOCKING"] == "1"


# -------------------------------------------------------------------- CLI --

@pytest.mark.parametrize("argv", [["gemm", "--sizes", "0"], ["gemm", "--dtypes", "fp64"],
                                  ["gemm", "--modes", "eager"], ["gemm", "--flags", "tf32=2"],
                                  ["gemm", "--repeats", "x"], ["gemm", "--repeats", "0"],
                                  ["nope"], [], ["latency", "--launches", "0"],
                                  ["gemm", "--api", "cublasxt"]])
def test_cli_bad_arguments_exit_2_before_any_gpu_work(argv, capsys, no_gpu):
    assert _cli.main(argv) == 2
    assert capsys.readouterr().err.strip()


def test_cli_outputs_are_checked_before_any_gpu_work(tmp_path, capsys, no_gpu, monkeypatch):
    assert _cli.main(["gemm", "--csv", "/no/such/dir/x.csv"]) == 2
    assert "/no/such/dir does not exist" in capsys.readouterr().err
    existing = tmp_path / "g.json"
    existing.write_text("keep")
    assert _cli.main(["gemm", "--json", str(existing)]) == 2
    assert "exists; use --force" in capsys.readouterr().err
    assert existing.read_text() == "keep"
    assert _cli.main(["latency", "--csv", str(existing)]) == 2
    assert _cli.main(["gemm", "--json", str(tmp_path), "--force"]) == 2
    assert "is a folder" in capsys.readouterr().err
    monkeypatch.setattr(_cli.importlib.util, "find_spec", lambda name: None)
    assert _cli.main(["gemm", "--plot", str(tmp_path / "p.png")]) == 1
    assert "needs matplotlib" in capsys.readouterr().err


def test_cli_force_reaches_the_benchmark(tmp_path, monkeypatch, capsys):
    existing = tmp_path / "g.csv"
    existing.write_text("old")
    called = {}

    def fake_gemm(**kw):
        called.update(kw)
        return _result()
    monkeypatch.setattr(bench, "gemm", fake_gemm)
    assert _cli.main(["gemm", "--sizes", "1024", "--csv", str(existing), "--force",
                      "--no-progress"]) == 0
    assert existing.read_text().startswith("m,n,k,dtype")
    assert called["progress"] is False and called["sizes"] == "1024"
    assert "wrote" in capsys.readouterr().out


def test_cli_defaults_are_the_apis():
    args = _cli.parser().parse_args(["gemm"])
    assert args.sizes == "1024,4096,8192" and args.dtypes == "fp32,tf32,bf16"
    assert args.repeats == 10 and args.loop_ms == 20.0 and args.lt_algos == 1
    assert args.progress is None and args.check is None and args.flush is True
    lat = _cli.parser().parse_args(["latency"])
    assert lat.launches == 1000 and lat.repeats == 20 and lat.samples == 2000
    assert _cli.parser().parse_args(["gemm", "--progress"]).progress is True
    assert _cli.parser().parse_args(["gemm", "-q"]).progress is False


def test_cli_help_and_flags_argument(capsys):
    assert _cli.main(["--help"]) == 0
    assert "gemm" in capsys.readouterr().out
    assert _cli.main(["bench", "gemm", "--sizes", "-1"]) == 2
    assert _cli.flags_arg("sweep") == "sweep"
    assert _cli.flags_arg("tf32=1,bf16_rr=off") == {"tf32": True, "bf16_rr": False}


# -------------------------------------------- benchmarks/seed_question.py --

def _seed_module(monkeypatch):
    import importlib.util
    import os
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "benchmarks")
    if not os.path.exists(os.path.join(here, "seed_question.py")):
        pytest.skip("benchmarks/ is not next to the tests (they run against an installed "
                    "cuda_debug)")
    monkeypatch.syspath_prepend(here)
    spec = importlib.util.spec_from_file_location("seed_question",
                                                  os.path.join(here, "seed_question.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _seed_doc():
    """A results document as seed_question.measure() writes it, from fake samples:
    a constant 10 us extra per GEMM under CUDA_LAUNCH_BLOCKING=1."""
    cfgs = bench.plan([1024, 4096], ["fp32", "bf16"], [dict(bench.TORCH_DEFAULT_FLAGS)])
    runs = []
    for c in cfgs:
        base = 1e-12 * c.flops / (50.0 if c.dtype == "fp32" else 600.0) * 1e3   # ms
        for mode, extra in (("async", 0.0), ("sync", 0.008), ("scope", 0.009),
                            ("launch_blocking", 0.010)):
            runs.append((c, mode, _raw([base + extra] * 3)))
    res = _results.build_gemm_result(runs, {"flush_bytes": 0, "peak_tflops": {}})
    versus = [{"dtype": c.dtype, "flags": c.flags_label, "n": c.m,
               "torch": {"ms": 1.0, "p10": 1.0, "p90": 1.01, "tflops": 100.0},
               "bench": {"gemmex": {"ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.02, "tflops": 100.0,
                                    "loop_n": 10},
                         "lt": {"ms": 1.1, "p10_ms": 1.0, "p90_ms": 1.1, "tflops": 90.0,
                                "loop_n": 10}}} for c in cfgs]
    return {"started": "2026-11-30 12:00 UTC", "command": "python benchmarks/seed_question.py",
            "env": {"gpu": "NVIDIA H200", "compute_capability": "9.0", "driver": "580",
                    "driver_cuda": "13.0", "cublas": "13.1.0", "torch": "2.11",
                    "torch_cuda": "13.0", "cuda_debug": "0.1.0", "git_commit": "abc1234"},
            "modes": list(bench.BASE_MODES), "sizes": [1024, 4096], "duration_s": 200.0,
            "sweep": {"rows": res.rows(), "meta": {}}, "versus": versus,
            "torch_clb": {"env": "1", "rows": [{"dtype": "bf16", "n": 1024, "times": [1.2] * 3}],
                          "error": None},
            "sync_debug": {"rows": [{"config": "async (default)", "launch_ms": 0.02,
                                     "kernel_ms": 200.0},
                                    {"config": "CUDA_LAUNCH_BLOCKING=1 (child process)",
                                     "launch_ms": 200.1, "kernel_ms": 200.2}]},
            "latency": {"rows": [{"mode": "async", "us": 4.2, "extra_us": 0.0, "call_us": 3.9}]}}


def test_seed_question_renders_every_table(monkeypatch, tmp_path):
    sq = _seed_module(monkeypatch)
    text = sq.render(_seed_doc(), "seed.png")
    assert "**NVIDIA H200**" in text and "commit `abc1234`" in text and "cuBLAS 13.1.0" in text
    assert "+10.0 us" in text and "extra time per GEMM is 10.0-10.0 us" in text
    assert "**bf16, reduced-precision reduction allowed (PyTorch's default)**" in text
    assert "| 1024 | 5.6 -> 8.9 (+59%) |" in text
    assert "torch.matmul itself under CUDA_LAUNCH_BLOCKING=1" in text
    assert "set_sync_debug_mode(1)` is not CUDA_LAUNCH_BLOCKING=1" in text and "200.100" in text
    assert "0.900 **below**" in text and "Target bench >= 0.97x torch: 4 of 8 met" in text
    assert "Target p90/p10 <= 1.05 for n >= 2048" in text and "worst 1.100" in text
    assert "![CUDA_LAUNCH_BLOCKING=1" in text
    # --render: no GPU, a section in an existing results file
    doc = tmp_path / "seed.json"
    doc.write_text(json.dumps(_seed_doc()))
    out = tmp_path / "RESULTS.md"
    out.write_text("# results\n\n## Other\n\nkeep me\n")
    assert sq.main(["--render", str(doc), "--out", str(out)]) == 0
    written = out.read_text()
    assert "keep me" in written and "<!-- BEGIN seed_question -->" in written
    if importlib.util.find_spec("matplotlib") is not None:
        png = tmp_path / "seed.png"
        assert sq.main(["--render", str(doc), "--out", str(out), "--plot", str(png)]) == 0
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert out.read_text().count("<!-- BEGIN seed_question -->") == 1


def test_results_section_is_replaced_in_place(monkeypatch, tmp_path):
    _seed_module(monkeypatch)
    import _common
    path = str(tmp_path / "RESULTS.md")
    with open(path, "w") as f:
        f.write("# results\n\n## Other\n\nkeep me\n")
    _common.write_results_section(path, "gemm", "GEMM", "first")
    _common.write_results_section(path, "gemm", "GEMM", "second")
    text = open(path).read()
    assert "keep me" in text and "second" in text and "first" not in text
    assert text.count("## GEMM") == 1
    monkeypatch.setenv("CUDA_DEBUG_COMMIT", "feedbee")
    assert _common.git_commit() == "feedbee"
