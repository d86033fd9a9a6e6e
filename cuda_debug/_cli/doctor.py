"""``cuda-debug doctor``: what cuda_debug finds here (cuda_debug/_environment.py
gathers the facts and says the verdict), as text or JSON.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import json
from typing import List, Optional

from .common import EXIT_ERROR, MODULE_PROG, _exit_status, _parser


def _doctor_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    p = _parser(prog, "doctor",
        "What cuda_debug finds here: driver, GPUs, libcuda / CUPTI / cuBLAS and "
        "where from, CUDA_LAUNCH_BLOCKING, whether CUPTI is free. Exit status 0 "
        "when watch() and launch_blocking() work here; 1 when they do not (no "
        "driver, no GPU, CUPTI missing or held): the verdict says why.")
    p.add_argument("--json", action="store_true",
                   help="print the facts as JSON (\"ok\": whether watch() and "
                        "launch_blocking() work here; \"problem\": why not)")
    return p


def doctor_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    try:
        ns = _doctor_parser(prog).parse_args(argv)
    except SystemExit as e:       # --help (0) or a usage error (2): a status, not an exit
        return _exit_status(e.code)
    from .. import _environment
    facts = _environment.full(probe_cupti=True)
    problem, verdict = _environment.verdict(facts)
    facts["verdict"] = verdict
    facts["ok"] = problem is None
    facts["problem"] = problem
    if ns.json:
        print(json.dumps(_doctor_json(facts), indent=2, sort_keys=True, default=str))
    else:
        print(_doctor_text(facts))
    return 0 if problem is None else EXIT_ERROR



def _lib_line(lib: Optional[dict]) -> str:
    if not lib:
        return "not looked for"
    if lib["found"]:
        return "%s (%s)" % (lib["path"], lib["how"])
    return "not found (%s)" % lib["error"]


#: doctor's `assert text` row for each assert_text "state" (the JSON says the state)
_ASSERT_TEXT = {
    "off": "not captured: CUDA_DEBUG_CAPTURE=off (it still reaches stderr)",
    "not_checked": "not checked (no libcuda)",
    "not_captured": "not captured: libcuda has no reference to stderr that can be redirected "
                    "(the device's assert text reaches stderr, but not the reports)",
    "captured": "captured from libcuda's writes to stderr (libc's stderr is left alone)",
}


def _assert_text_line(a: dict) -> str:
    return _ASSERT_TEXT[a.get("state", "not_checked")]


def _doctor_json(facts: dict) -> dict:
    """What --json prints: the facts the text shows, with one list of GPUs,
    ``devices``: the driver's (``"source": "driver"``), or where the driver
    lists none, the kernel module's (``"source": "/proc/driver/nvidia"``)."""
    out = dict(facts)
    models = out.pop("gpus", None) or []
    out["devices"] = [dict(dev, source="driver") for dev in facts.get("devices") or []]
    if not out["devices"]:
        out["devices"] = [{"index": i, "name": m, "source": "/proc/driver/nvidia"}
                          for i, m in enumerate(models)]
    return out


def _doctor_text(d: dict) -> str:
    rows = [("cuda_debug", "%s, Python %s (%s)" % (d["cuda_debug"], d["python"], d["executable"])),
            ("built with", "CUDA %s headers, CUPTI %s" % (d["cuda_headers"], d["cupti_headers"])),
            ("frame reader", d["frame_reader"])]
    if d.get("free_threaded"):
        rows.append(("free-threaded", "GIL re-enabled: cuda_debug._core does not declare itself "
                     "safe without it" if d["gil_enabled"] else
                     "GIL disabled (PYTHON_GIL=0): cuda_debug._core was not made safe without it"))
    drv = d["driver"] or "?"
    if d["libcuda"]["found"]:
        rows.append(("driver", "%s, supports CUDA %s" % (drv, d.get("driver_cuda") or "?")))
    else:
        rows.append(("driver", "none%s" % (" (kernel module %s)" % d["driver"] if d["driver"] else "")))
    rows.append(("libcuda", _lib_line(d["libcuda"])))
    init = d.get("init")
    if init and init["code"]:
        rows.append(("cuInit", "%s (%d)%s" % (init["name"], init["code"],
                                             ": no GPU visible" if init["code"] == 100 else "")))
    if d["devices"]:
        for dev in d["devices"]:
            if "error" in dev:
                rows.append(("GPU %d" % dev["index"], "error %s" % dev["error"]))
            else:
                rows.append(("GPU %d" % dev["index"], "%s: %s, %s GiB, %d SMs" % (
                    dev["name"], dev["sm"], dev["memory_gib"], dev["sms"])))
    elif d["gpus"]:
        rows.append(("GPUs (/proc)", ", ".join(d["gpus"])))
    else:
        rows.append(("GPU", "none found"))
    rows.append(("CUDA toolkit", ", ".join(d["toolkits"]) or "none found (CUDA_HOME, /usr/local/cuda)"))
    rows.append(("cuda.pathfinder", d.get("pathfinder") or
                 "not installed: CUPTI and cuBLAS cannot be looked for (pip install cuda-pathfinder)"))
    cupti = _lib_line(d["cupti"])
    if d.get("cupti_version"):
        cupti = "%s: %s" % (d["cupti_version"], cupti)
    rows.append(("CUPTI", cupti))
    rows.append(("cuBLAS", _lib_line(d["cublas"])))
    free = d.get("cupti_free")
    if free is None:
        rows.append(("CUPTI free", "not checked (no GPU)" if not d["devices"] else "not checked"))
    elif free.get("free"):
        rows.append(("CUPTI free", "yes: launch_blocking() subscribed and let go"))
    else:
        rows.append(("CUPTI free", "no: %s" % free.get("error")))
    rows.append(("assert text", _assert_text_line(d.get("assert_text") or {})))
    env = d["env"]
    clb = env.get("CUDA_LAUNCH_BLOCKING")
    rows.append(("CUDA_LAUNCH_BLOCKING", "not set" if clb is None else
                 "%r: every launch of processes started from this environment is synchronous "
                 "(read once, when the context is created)" % clb))
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH"):
        if k in env:
            note = " (a tool injected into CUDA: it may hold CUPTI)" if "INJECTION" in k else ""
            rows.append((k, env[k] + note))
    if d["frameworks"]:
        rows.append(("frameworks", ", ".join("%s %s" % kv for kv in sorted(d["frameworks"].items()))))
    width = max(len(k) for k, _ in rows)
    lines = ["%-*s  %s" % (width, k, v) for k, v in rows]
    lines.append("")
    lines.append("verdict: " + d["verdict"])
    return "\n".join(lines)
