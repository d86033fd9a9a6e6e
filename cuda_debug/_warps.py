"""Where a hung kernel's warps are, the process alive: cuda-gdb attached for a
moment, read, detached.

``cuda-debug dump PID --warps`` (or ``CUDA_DEBUG_WARPS=1``) runs cuda-gdb in
batch mode against the process twice, a moment apart (``info cuda kernels``,
``info cuda threads``: the device's threads grouped by PC, with their source
line), then detaches: the process runs on. Between the two looks a group
whose PC moved but stayed on one line spins there; one whose PC stayed put on
a barrier instruction waits at the barrier; one that stayed put elsewhere
waits (a flag, a long memory operation). It never kills, signals or aborts
the target: cuda-gdb's ``detach`` leaves it as it was, and a look that runs
past its time is ended (cuda-gdb is killed, never the target).

Opt-in only: attaching stops the whole process for about a second.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import re
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

ENV = "CUDA_DEBUG_WARPS"
#: The cuda-gdb to use, where it is not found by itself (a path; only it is tried).
EXE_ENV = "CUDA_DEBUG_CUDA_GDB"
#: One look's time limit (seconds): cuda-gdb's start and attach take ~1 s.
LOOK_TIMEOUT = 30.0
#: The pause between the two looks (seconds).
GAP = 0.5
#: cuda-gdb's output read, at most (bytes), and the groups kept per kernel.
OUTPUT_MAX = 4 << 20
GROUPS_MAX = 16

COMMANDS = ("set pagination off", "set confirm off", "info cuda kernels", "info cuda threads")


def allowed(flag: Optional[bool] = None) -> bool:
    """The user's say: the --warps flag, else CUDA_DEBUG_WARPS (1/0)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV, "").strip().lower() in ("1", "yes", "true", "on")


def find_cuda_gdb() -> Tuple[Optional[str], List[str]]:
    """(path, places looked): $CUDA_DEBUG_CUDA_GDB alone where it is set, else
    PATH, $CUDA_HOME/$CUDA_PATH/bin, /usr/local/cuda/bin, /usr/local/cuda-*/bin
    (newest first)."""
    env = os.environ.get(EXE_ENV)
    if env:
        ok = os.path.isfile(env) and os.access(env, os.X_OK)
        return (env if ok else None), ["$%s=%s" % (EXE_ENV, env)]
    import shutil
    tried = ["PATH"]
    hit = shutil.which("cuda-gdb")
    if hit:
        return hit, tried
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    try:
        roots += sorted((os.path.join("/usr/local", d) for d in os.listdir("/usr/local")
                         if d.startswith("cuda-")), reverse=True)
    except OSError:
        pass
    for root in dict.fromkeys(r for r in roots if r):
        p = os.path.join(root, "bin", "cuda-gdb")
        tried.append(os.path.dirname(p))
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p, tried
    return None, tried


def ptrace_refusal(pid: int) -> Optional[str]:
    """Why this user may not attach to `pid` (one line with the remedy), or
    None where nothing is known to stop it."""
    try:
        st = os.stat("/proc/%d" % pid)
    except OSError:
        return "process %d is gone" % pid
    uid = os.geteuid()
    if uid != 0 and st.st_uid != uid:
        return ("process %d belongs to another user (uid %d): run dump as that user (or root) "
                "to see its warps" % (pid, st.st_uid))
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip() or 0)
    except (OSError, ValueError):
        scope = 0
    if scope >= 3:
        return ("kernel.yama.ptrace_scope is 3: no process may attach to another; set it lower "
                "(sysctl kernel.yama.ptrace_scope=1, needs a reboot from 3) to see the warps")
    if scope == 2 and uid != 0:
        return ("kernel.yama.ptrace_scope is 2: only root may attach; run dump as root, or "
                "sysctl kernel.yama.ptrace_scope=0, to see the warps")
    if scope == 1 and uid != 0 and not _is_ancestor(os.getpid(), pid):
        return ("kernel.yama.ptrace_scope is 1: only a parent may attach; run dump with sudo, "
                "or sysctl kernel.yama.ptrace_scope=0, to see the warps")
    return None


#: The driver's CUDA debugger back-end, installed with the driver beside libcuda.so.1.
BACKEND = "libcudadebugger.so.1"


def backend_missing(pid: int, maps: Optional[str] = None) -> Optional[str]:
    """Why cuda-gdb cannot read `pid`'s GPU (one line with the remedy), or None.
    cuda-gdb needs the driver's CUDA debugger back-end (libcudadebugger.so.1),
    which the driver installs beside libcuda.so.1 but a container may leave out.
    Without it cuda-gdb says "Could not find CUDA Debugger back-end", and on an
    H100 the process it had attached to then died (SIGSEGV): so no attach is
    made without it. Looked for beside the libcuda the process loaded (its
    /proc/PID/maps; `maps`: that text, for tests) and by the loader's cache."""
    if maps is None:
        try:
            with open("/proc/%d/maps" % pid) as f:
                maps = f.read(8 << 20)
        except OSError:
            return None                          # ptrace_refusal says why
    folders = []
    for line in maps.splitlines():
        path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
        if "/libcuda.so" in path and os.path.dirname(path) not in folders:
            folders.append(os.path.dirname(path))
    if not folders:
        return ("process %d has not loaded the CUDA driver (libcuda.so.1): no kernel of its "
                "can be running" % pid)
    if any(os.path.exists(os.path.join(d, BACKEND)) for d in folders):
        return None
    import ctypes.util
    if ctypes.util.find_library("cudadebugger"):
        return None
    return ("the driver's CUDA debugger back-end (%s) is not installed beside %s: cuda-gdb "
            "cannot read the GPU without it (and attaching anyway has crashed the process), so "
            "none is attached; install the driver's full package (in a container, give it the "
            "NVIDIA container toolkit's `compute,utility` driver capabilities) to see the warps"
            % (BACKEND, os.path.join(folders[0], "libcuda.so.1")))


def _is_ancestor(me: int, pid: int) -> bool:
    for _ in range(64):
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == me:
            return True
        if pid <= 1:
            return False
    return False


class Group(NamedTuple):
    kernel: int                      # cuda-gdb's kernel number
    pc: int
    file: Optional[str]
    line: Optional[int]
    threads: int
    first_block: str                 # "(0,0,0)"
    first_thread: str
    last_block: str
    last_thread: str


_TUPLE = r"\(\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\)"
_THREADS_ROW = re.compile(r"^\s*\*?\s*(%s)\s+(%s)\s+(%s)\s+(%s)\s+(\d+)\s+(0x[0-9a-fA-F]+)"
                          r"(?:\s+(\S+)\s+(\d+))?\s*$" % (_TUPLE, _TUPLE, _TUPLE, _TUPLE))
_KERNEL_HEAD = re.compile(r"^\s*Kernel\s+(\d+)\s*$")
_X_I = re.compile(r"(0x[0-9a-fA-F]+)\s*(?:<[^>]*>)?:\s*(\S.*)$")
_INFO_LINE = re.compile(r'Line\s+(\d+)\s+of\s+"([^"]+)"\s+starts at address\s+(0x[0-9a-fA-F]+)'
                        r'.*?and ends at\s+(0x[0-9a-fA-F]+)')


def _squash(t: str) -> str:
    return re.sub(r"\s", "", t)


def parse_threads(out: str) -> List[Group]:
    """The rows of ``info cuda threads`` (coalesced: a run of threads at one PC
    per row: first block and thread, last block and thread, count, PC, file,
    line), under their ``Kernel N`` headings."""
    groups, kernel = [], 0
    for raw in out.splitlines():
        m = _KERNEL_HEAD.match(raw)
        if m:
            kernel = int(m.group(1))
            continue
        m = _THREADS_ROW.match(raw)
        if m:
            groups.append(Group(kernel, int(m.group(6), 16), m.group(7),
                                int(m.group(8)) if m.group(8) else None, int(m.group(5)),
                                _squash(m.group(1)), _squash(m.group(2)), _squash(m.group(3)),
                                _squash(m.group(4))))
    return groups


def parse_kernels(out: str) -> Dict[int, str]:
    """``info cuda kernels``: kernel number -> its invocation (``spin()``)."""
    names = {}
    seen_head = False
    for raw in out.splitlines():
        if re.match(r"^\s*Kernel\s+Parent\s+Dev", raw):
            seen_head = True
            continue
        if not seen_head:
            continue
        parts = raw.lstrip(" *").split()
        if len(parts) >= 9 and parts[0].isdigit() and parts[6].startswith("("):
            names[int(parts[0])] = " ".join(parts[8:])[:200]
        elif parts and not parts[0].isdigit():
            seen_head = False
    return names


def parse_instructions(out: str) -> Dict[int, str]:
    """Address -> instruction, from the ``x/i`` lines of a look."""
    pcs = {}
    for raw in out.splitlines():
        m = _X_I.search(raw.replace("=>", " "))
        if m and not re.search(r"\bLine\s+\d+\s+of\b", raw):
            pcs[int(m.group(1), 16)] = re.sub(r"\s+", " ", m.group(2)).strip()[:120]
    return pcs


def parse_info_lines(out: str) -> List[Tuple[int, int, str, int]]:
    """``info line *ADDR``: (start, end, file, line) ranges."""
    return [(int(m.group(3), 16), int(m.group(4), 16), m.group(2), int(m.group(1)))
            for m in _INFO_LINE.finditer(out)]


class Look(NamedTuple):
    groups: List[Group]
    kernels: Dict[int, str]
    instructions: Dict[int, str]
    seconds: float
    error: Optional[str]
    raw: str
    lines: List[Tuple[int, int, str, int]] = []


#: A SASS instruction's size (sm_70 and later): the barrier a warp waits at is
#: the instruction before its PC.
INSN = 16


def look(pid: int, exe: str, pcs: Tuple[int, ...] = (), timeout: float = LOOK_TIMEOUT) -> Look:
    """One attach-read-detach of `pid` by cuda-gdb `exe`; `pcs`: where to read
    the instruction before and at (``x/2i``) and the line before, in the same stop."""
    import subprocess                  # (here: dump without --warps runs none)
    cmd = [exe, "-batch", "-nx", "-q"]
    for c in COMMANDS:
        cmd += ["-ex", c]
    for pc in pcs[:GROUPS_MAX]:
        cmd += ["-ex", "x/2i 0x%x" % (pc - INSN), "-ex", "info line *0x%x" % (pc - INSN)]
    cmd += ["-ex", "detach", "-p", str(pid)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        out = (p.stdout[:OUTPUT_MAX] + b"\n" + p.stderr[:OUTPUT_MAX]).decode("utf-8", "replace")
        err = None
    except subprocess.TimeoutExpired as e:
        out = ((e.stdout or b"")[:OUTPUT_MAX]).decode("utf-8", "replace")
        err = "cuda-gdb did not finish in %.0f s (it was stopped; the process was not)" % timeout
    except OSError as e:
        return Look([], {}, {}, time.monotonic() - t0, "cuda-gdb could not run: %s" % e, "")
    seconds = time.monotonic() - t0
    if err is None and re.search(r"ptrace: Operation not permitted|Could not attach", out):
        err = ("cuda-gdb was refused the attach (ptrace: operation not permitted): run dump "
               "as the process's user or root, or sysctl kernel.yama.ptrace_scope=0")
    return Look(parse_threads(out), parse_kernels(out), parse_instructions(out), seconds, err,
                out, parse_info_lines(out))


def _is_barrier(insn: Optional[str]) -> bool:
    return bool(insn) and bool(re.match(r"^(@!?U?P\w+\s+)?(BAR|BARRIER|B?SYNC|WARPSYNC)\b",
                                        insn.upper()))


def _order(block: str, thread: str) -> tuple:
    b = [int(v) for v in block.strip("()").split(",")]
    t = [int(v) for v in thread.strip("()").split(",")]
    return (b[2], b[1], b[0], t[2], t[1], t[0])


def _covering(first: Look, g: Group) -> Optional[Group]:
    at = _order(g.first_block, g.first_thread)
    for r in first.groups:
        if r.kernel == g.kernel and \
                _order(r.first_block, r.first_thread) <= at <= _order(r.last_block, r.last_thread):
            return r
    return None


def states(first: Look, second: Look) -> List[dict]:
    """The second look's groups, each compared with where the same threads were
    in the first: "spinning" (their PC moved), "at a barrier" (it stayed, just
    after a barrier instruction: the warp waits there), "waiting" (it stayed
    elsewhere: a flag, a long memory operation), "" (one look); merged by
    kernel, line and state, with threads, warps and PCs."""
    rows: Dict[tuple, dict] = {}
    for g in second.groups:
        before = _covering(first, g) if first.groups else None
        file, line, insn = g.file, g.line, None
        if before is None:
            state = ""
        elif before.pc != g.pc:
            state = "spinning"
        else:
            prev = second.instructions.get(g.pc - INSN) or first.instructions.get(g.pc - INSN)
            here = second.instructions.get(g.pc) or first.instructions.get(g.pc)
            if _is_barrier(prev) or _is_barrier(here):
                state, insn = "at a barrier", prev if _is_barrier(prev) else here
                if _is_barrier(prev):
                    for lo, hi, f, n in second.lines + first.lines:
                        if lo <= g.pc - INSN < hi:
                            file, line = f, n
                            break
            else:
                state, insn = "waiting", here
        key = (g.kernel, file, line, state)
        r = rows.setdefault(key, {"kernel": g.kernel, "file": file, "line": line, "state": state,
                                  "pcs": [], "threads": 0, "warps": 0, "instruction": insn,
                                  "first_block": g.first_block, "first_thread": g.first_thread})
        if "0x%x" % g.pc not in r["pcs"]:
            r["pcs"].append("0x%x" % g.pc)
        r["threads"] += g.threads
        r["warps"] += (g.threads + 31) // 32
    return sorted(rows.values(), key=lambda r: (r["kernel"], -r["threads"]))


def warps(pid: int, exe: Optional[str] = None, gap: float = GAP,
          timeout: float = LOOK_TIMEOUT, check: bool = True) -> dict:
    """Two looks at `pid`'s device threads: {"groups": [...], "kernels":
    {n: text}, "seconds": [look, look], "note": None or the one-line reason}.
    `check`: say first why ptrace would be refused (not for this process,
    which lets its own cuda-gdb attach: own_warps)."""
    if exe is None:
        exe, tried = find_cuda_gdb()
        if exe is None:
            return {"groups": [], "kernels": {}, "seconds": [], "note":
                    "warps: cuda-gdb was not found (looked in %s): install the CUDA toolkit's "
                    "cuda-gdb or put it on PATH to see where the kernel's warps are"
                    % ", ".join(tried)}
    why = (ptrace_refusal(pid) if check else None) or backend_missing(pid)
    if why:
        return {"groups": [], "kernels": {}, "seconds": [], "note": "warps: " + why}
    one = look(pid, exe, timeout=timeout)
    if one.error:
        return {"groups": [], "kernels": one.kernels, "seconds": [one.seconds],
                "note": "warps: " + one.error}
    if not one.groups:
        return {"groups": [], "kernels": one.kernels, "seconds": [one.seconds],
                "note": "warps: no kernel was running on the device when cuda-gdb looked"}
    time.sleep(gap)
    two = look(pid, exe, tuple(dict.fromkeys(g.pc for g in one.groups)), timeout=timeout)
    if two.error or not two.groups:
        groups = states(Look([], {}, {}, 0, None, ""), one)
        return {"groups": groups[:GROUPS_MAX], "kernels": one.kernels,
                "seconds": [one.seconds, two.seconds],
                "note": "warps: one look only (%s)" % (two.error or "the kernel had finished")}
    return {"groups": states(one, two)[:GROUPS_MAX], "kernels": two.kernels or one.kernels,
            "seconds": [one.seconds, two.seconds], "note": None}


def lines(doc: dict) -> List[str]:
    """The report's lines: one per group, ``  kernel 0: 96 warps spinning at
    spin.cu:8`` (with the instruction at a barrier), or the note."""
    out = []
    if doc.get("note"):
        out.append(doc["note"])
    for g in doc.get("groups") or ():
        where = "%s:%s" % (g["file"], g["line"]) if g.get("file") and g.get("line") else \
            "pc %s (no line info)" % g["pcs"][0]
        name = (doc.get("kernels") or {}).get(g["kernel"]) or \
            (doc.get("kernels") or {}).get(str(g["kernel"])) or "kernel %s" % g["kernel"]
        name = name.split("(")[0].strip() or name
        what = " " + g["state"] if g.get("state") else ""
        out.append("%d warp%s (%d threads)%s at %s in %s%s" % (
            g["warps"], "" if g["warps"] == 1 else "s", g["threads"], what, where,
            name[:80],
            " [%s]" % g["instruction"] if g.get("state") in ("at a barrier", "waiting") and
            g.get("instruction") else ""))
    if doc.get("seconds"):
        out.append("(cuda-gdb attached, read and detached: %s s; the process ran on)"
                   % " + ".join("%.1f" % s for s in doc["seconds"]))
    return out


# -- the hang_after report: this process's own warps ----------------------------------

PR_SET_PTRACER = 0x59616d61          # linux/prctl.h (Yama)
PR_SET_PTRACER_ANY = -1


def own_warps() -> dict:
    """warps() of this process, from a thread of it: its cuda-gdb (a child)
    may attach to it for the look (Yama's ptrace_scope 1 lets a process name
    who may trace it: PR_SET_PTRACER, any process of this user for the moment,
    then no one again)."""
    import ctypes
    exe, tried = find_cuda_gdb()
    if exe is None:
        return warps(os.getpid())                 # the one line: not found, where looked
    libc = ctypes.CDLL(None, use_errno=True)
    set_ptracer = getattr(libc, "prctl", None)
    if set_ptracer is not None:
        set_ptracer(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0)
    try:
        return warps(os.getpid(), exe, check=False)
    finally:
        if set_ptracer is not None:
            set_ptracer(PR_SET_PTRACER, ctypes.c_ulong(0), 0, 0, 0)


class HangLooker:
    """With ``watch(hang_after=s)`` and CUDA_DEBUG_WARPS=1: after each hang
    report (written by C's hang watcher), a look at where the stuck kernel's
    warps are, written to stderr below it. A Python thread polls the count of
    reports (4 times a second, while a hang_after watch is open): it needs the
    GIL, which a thread stuck in a CUDA wait has released (torch's and CuPy's
    synchronize do); where the stuck thread holds it, no look is made and
    `cuda-debug dump --warps PID` from a shell gives the same."""

    def __init__(self, reports_now: int, count_reports, active) -> None:
        import threading
        self._seen = reports_now
        self._count = count_reports
        self._active = active
        self._thread = threading.Thread(target=self._run, name="cuda_debug-warps", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import sys
        while self._active():
            time.sleep(0.25)
            n = self._count()
            if n <= self._seen:
                continue
            self._seen = n
            try:
                doc = own_warps()
                text = "".join("  %s\n" % line for line in lines(doc))
                sys.stderr.write("cuda_debug: where the stuck kernel's warps are (cuda-gdb "
                                 "attached for a moment, then detached):\n" + text)
                sys.stderr.flush()
            except Exception as e:                 # never in the program's way
                sys.stderr.write("cuda_debug: warps: the look failed: %s\n" % e)
