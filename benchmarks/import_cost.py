"""What ``import cuda_debug`` (and ``import cuda_debug.bench``) costs at start-up.

Usage:
    python benchmarks/import_cost.py [--samples 21] [--top 10] [--json out.json]
                                     [--results benchmarks/RESULTS.md]

Each sample is a fresh interpreter of a clean virtual environment made for the
run (``venv``, no pip: no ``.pth`` file of this machine's site-packages runs at
start-up), with ``-X importtime``, running one of

    bare        python -c pass
    cuda_debug  python -c "import cuda_debug"
    bench       python -c "import cuda_debug.bench"

interleaved, after one warm-up run of each (byte code cached under a temporary
``-X pycache_prefix``, as an installed package has it). cuda_debug (and NumPy,
for bench) come from PYTHONPATH: the copy this script imports (this checkout).
Prints, per statement, the median over the samples of the process's wall time,
of its total import time (the top-level entries of ``-X importtime``) and of
cuda_debug's own top-level entries, the differences from bare, whether
``import cuda_debug`` is within 3 ms of bare (the target), and the modules with
the largest median self time. ``--results`` writes the table into that Markdown
file's ``import_cost`` section. No GPU is involved: it measures start-up only.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv

from _common import git_commit, write_results_section   # (puts this checkout first on sys.path)

STATEMENTS = (("bare", "pass"), ("cuda_debug", "import cuda_debug"),
              ("bench", "import cuda_debug.bench"))
TARGET_MS = 3.0


def parse_importtime(stderr: str):
    """[(self_us, cumulative_us, depth, module)] from ``-X importtime`` lines."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append((int(self_us), int(cum_us), depth, name.strip()))
    return rows


def search_path() -> str:
    """cuda_debug's folder, then NumPy's, without importing NumPy here."""
    import importlib.util
    import cuda_debug
    folders = [os.path.dirname(os.path.dirname(os.path.abspath(cuda_debug.__file__)))]
    spec = importlib.util.find_spec("numpy")
    if spec is not None and spec.origin:
        folders.append(os.path.dirname(os.path.dirname(spec.origin)))
    return os.pathsep.join(dict.fromkeys(folders))


def measure(samples: int):
    work = tempfile.mkdtemp(prefix="cuda_debug_import_cost_")
    try:
        venv.EnvBuilder(with_pip=False, symlinks=True).create(os.path.join(work, "venv"))
        python = os.path.join(work, "venv", "bin", "python")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTHON") and not k.startswith("CUDA_DEBUG_")}
        env["PYTHONPATH"] = search_path()
        cmd = [python, "-X", "importtime", "-X", "pycache_prefix=" + os.path.join(work, "pyc"),
               "-c"]
        out = {name: {"wall_ms": [], "import_ms": [], "own_ms": [], "self_us": {}}
               for name, _ in STATEMENTS}

        def run(stmt):
            t0 = time.perf_counter()
            p = subprocess.run(cmd + [stmt], env=env, capture_output=True, text=True,
                               cwd=work, timeout=120)
            wall = (time.perf_counter() - t0) * 1e3
            if p.returncode:
                raise RuntimeError("%r failed: %s" % (stmt, p.stderr[-2000:]))
            return wall, parse_importtime(p.stderr)

        for _, stmt in STATEMENTS:                  # warm-up: writes the byte code
            run(stmt)
        for _ in range(samples):
            for name, stmt in STATEMENTS:
                wall, rows = run(stmt)
                d = out[name]
                d["wall_ms"].append(wall)
                d["import_ms"].append(sum(cum for _, cum, depth, _ in rows if depth == 0) / 1e3)
                d["own_ms"].append(sum(cum for _, cum, depth, module in rows if depth == 0 and
                                       module.split(".")[0] == "cuda_debug") / 1e3)
                for self_us, _, _, module in rows:
                    d["self_us"].setdefault(module, []).append(self_us)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(out, top: int) -> dict:
    bare = {k: statistics.median(out["bare"][k]) for k in ("wall_ms", "import_ms")}
    rows = []
    for name, stmt in STATEMENTS:
        d = out[name]
        wall, imp = statistics.median(d["wall_ms"]), statistics.median(d["import_ms"])
        own = statistics.median(d["own_ms"])
        new = {m: statistics.median(v) for m, v in d["self_us"].items()
               if m not in out["bare"]["self_us"]}
        rows.append({"name": name, "statement": stmt, "wall_ms": round(wall, 2),
                     "import_ms": round(imp, 2), "wall_vs_bare_ms": round(wall - bare["wall_ms"], 2),
                     "import_vs_bare_ms": round(imp - bare["import_ms"], 2),
                     "cuda_debug_entries_ms": round(own, 2),
                     "cuda_debug_entries_min_ms": round(min(d["own_ms"]), 2),
                     "modules": len(new),
                     "top_self_us": sorted(new.items(), key=lambda kv: -kv[1])[:top]})
    extra = rows[1]["import_vs_bare_ms"]
    return {"rows": rows, "target_ms": TARGET_MS, "target_met": extra <= TARGET_MS}


def render(summary: dict, samples: int) -> str:
    lines = ["| statement | wall ms | import ms | vs bare: wall | vs bare: import "
             "| cuda_debug's own entries (min) | modules added |",
             "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append("| `%s` | %.2f | %.2f | %+.2f | %+.2f | %.2f (%.2f) | %d |" % (
            r["statement"], r["wall_ms"], r["import_ms"], r["wall_vs_bare_ms"],
            r["import_vs_bare_ms"], r["cuda_debug_entries_ms"],
            r["cuda_debug_entries_min_ms"], r["modules"]))
    lines.append("")
    lines.append("Medians of %d fresh interpreters each (ms). import: the process's top-level "
                 "`-X importtime` entries, summed; cuda_debug's own entries: those of "
                 "`cuda_debug` and `cuda_debug.*` (their cumulative times: everything they "
                 "import; min: the fastest sample, the least disturbed by other load). Target: `import cuda_debug` within %.0f ms of bare (import "
                 "column): %s." % (samples, summary["target_ms"],
                                   "met" if summary["target_met"] else "MISSED"))
    for r in summary["rows"][1:]:
        lines.append("")
        lines.append("Largest self times under `%s` (median us): %s." % (
            r["statement"], ", ".join("%s %d" % (m, us) for m, us in r["top_self_us"])))
    return "\n".join(lines)


def machine() -> str:
    commit = git_commit()
    cpus = os.cpu_count()
    load = " (load average %.1f when it started)" % os.getloadavg()[0] \
        if hasattr(os, "getloadavg") else ""
    return "%s, Python %s, %s CPU%s%s, no GPU involved (start-up only); commit `%s`" % (
        platform.platform(), platform.python_version(), cpus, "s" if cpus != 1 else "", load,
        commit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--samples", type=int, default=21, help="interpreters per statement")
    ap.add_argument("--top", type=int, default=10, help="modules listed by self time")
    ap.add_argument("--json", metavar="PATH", help="write the samples and the summary as JSON")
    ap.add_argument("--results", metavar="PATH",
                    help="write the table into this Markdown file's import_cost section")
    a = ap.parse_args(argv)
    where = machine()
    out = measure(a.samples)
    summary = summarize(out, a.top)
    text = render(summary, a.samples)
    print(where)
    print()
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": where, "summary": summary, "samples": out}, f, indent=1)
    if a.results:
        write_results_section(a.results, "import_cost",
                              "Import cost: `import cuda_debug` at start-up (import_cost.py)",
                              "%s.\n\n`python benchmarks/import_cost.py --samples %d`\n\n%s"
                              % (where, a.samples, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
