"""Probe (issue 27): what torch 2.11 and the driver expose for CUDA graphs, and what
the candidate mechanisms cost, before choosing how to name nodes in every path.

Command (repo root, after `python3 -m pip install --no-build-isolation --no-deps -e .`):

    python benchmarks/probes/graphs_facts.py            # ~80 s on the H200

Prints one block per section (lines start with the section tag) and, last, one
line `JSON {...}` with everything; with $OUT set it also writes
$OUT/graphs_facts.json. Sections (each in try/except: a failure prints
`Sx FAILED ...` and the rest go on):

  S1 versions; what torch.cuda.CUDAGraph / torch.cuda.graph expose in 2.11
     (keep_graph, raw_cuda_graph(_exec), capture-end / instantiate hooks,
     graph_annotations); which driver entry points libcuda exports.
  S2 naming nodes without CUPTI (item 3): inside a wrapped CUDAGraph.capture_end,
     while the stream still captures, cuStreamGetCaptureInfo_v3 -> the graph;
     cuGraphGetNodes + cuGraphNodeGetType + cuGraphKernelNodeGetParams_v2 +
     cuFuncGetName: the kernels, in which order, and the cost per node (a small
     graph of known kernels; the transformer training step). Also an NCCL
     all_reduce of a single-rank group captured in a graph (its node names).
  S3 what CUPTI costs outside watch (item 3's capture-only subscription): a tiny
     `x.add_(1)` loop (us per op, best of 5 x 10,000), fresh process per config,
     3 configs x 2 rounds interleaved: plain (cuda_debug imported, CUPTI never
     subscribed), held (subscribed with only the capture ids + resource domain
     enabled), after (subscribed once with those, then unsubscribed).
  S4 marker topologies (the graph replay target <= 1.02x): the 200-tiny-kernel graph
     and the transformer step graph (keep_graph=True), cloned and edited with the
     graph API, each variant instantiated and replayed (ms per replay, 2 rounds,
     interleaved): none; chain1 (a one-thread marker kernel between every kernel and
     its successors: today's default); chain8 (every 8th kernel); leaf (a marker
     kernel depending on each kernel, nothing depending on it); leafchain (each
     marker depends on its kernel and on the previous marker); chain8+leafchain.
     Marker variants also get a start marker and a clearing memset, as captured.
  S5 torch.compile(mode="reduce-overhead") under watch() (item 1), no fault: the
     Python stack at the CUDAGraph.replay call and at the recording's kernel
     launches (depth, kinds as _core.code_kind gives them), the frames the ring
     record of a replay and the node records kept, where Inductor's generated
     module is (sys.modules, PyCodeCache) and what its line map gives.
  S6 leaf markers at a fault (is a leaf marker of the node before the faulting one
     written?): a 60-kernel chain, node 37 an index_select with a bad index, markers
     without the clearing memset; child processes: chain1 once, leafchain 3 times;
     after the fault, the first node whose marker is missing (37 = exact).
"""
import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
import traceback

T0 = time.perf_counter()
OUT = {}


def say(tag, *parts):
    print(tag, *parts, flush=True)


def elapsed():
    return time.perf_counter() - T0


def section(tag):
    def deco(fn):
        def run(*a, **kw):
            t = time.perf_counter()
            try:
                r = fn(*a, **kw)
            except Exception as e:
                say(tag, "FAILED", repr(e)[:300])
                traceback.print_exc(limit=4)
                OUT[tag] = {"failed": repr(e)[:300]}
                r = None
            say(tag, "took %.1f s" % (time.perf_counter() - t))
            return r
        return run
    return deco


# --------------------------------------------------------------------- driver --
cu = ctypes.CDLL("libcuda.so.1")
V, P, I, U, U64, SZ = (ctypes.c_void_p, ctypes.POINTER, ctypes.c_int, ctypes.c_uint,
                       ctypes.c_uint64, ctypes.c_size_t)


def dfn(name, *argtypes):
    f = getattr(cu, name, None)
    if f is None:
        return None
    f.restype = I
    f.argtypes = list(argtypes)
    return f


class KP(ctypes.Structure):           # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", V), ("gx", U), ("gy", U), ("gz", U), ("bx", U), ("by", U),
                ("bz", U), ("shmem", U), ("params", V), ("extra", V), ("kern", V),
                ("ctx", V)]


class MP(ctypes.Structure):           # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", U64), ("pitch", SZ), ("value", U), ("elem", U), ("width", SZ),
                ("height", SZ)]


D = dict(
    getinfo=dfn("cuStreamGetCaptureInfo_v3", V, P(I), P(U64), P(V), P(V), P(V), P(SZ)),
    nodes=dfn("cuGraphGetNodes", V, V, P(SZ)),
    ntype=dfn("cuGraphNodeGetType", V, P(I)),
    kparams=dfn("cuGraphKernelNodeGetParams_v2", V, P(KP)),
    fname=dfn("cuFuncGetName", P(ctypes.c_char_p), V),
    kname=dfn("cuKernelGetName", P(ctypes.c_char_p), V),
    edges=dfn("cuGraphGetEdges_v2", V, V, V, V, P(SZ)),
    dependents=dfn("cuGraphNodeGetDependentNodes_v2", V, V, V, P(SZ)),
    addk=dfn("cuGraphAddKernelNode_v2", P(V), V, V, SZ, P(KP)),
    addms=dfn("cuGraphAddMemsetNode", P(V), V, V, SZ, P(MP), V),
    adddep=dfn("cuGraphAddDependencies_v2", V, V, V, V, SZ),
    rmdep=dfn("cuGraphRemoveDependencies_v2", V, V, V, V, SZ),
    clone=dfn("cuGraphClone", P(V), V),
    inst=dfn("cuGraphInstantiateWithFlags", P(V), V, ctypes.c_ulonglong),
    launch=dfn("cuGraphLaunch", V, V),
    execdestroy=dfn("cuGraphExecDestroy", V),
    gdestroy=dfn("cuGraphDestroy", V),
    hostalloc=dfn("cuMemHostAlloc", P(V), SZ, U),
    hostdev=dfn("cuMemHostGetDevicePointer_v2", P(U64), V, U),
    modload=dfn("cuModuleLoadData", P(V), ctypes.c_char_p),
    modfn=dfn("cuModuleGetFunction", P(V), V, ctypes.c_char_p),
    ctxget=dfn("cuCtxGetCurrent", P(V)),
    drvver=dfn("cuDriverGetVersion", P(I)),
)

MARKER_PTX = (b".version 7.0\n.target sm_70\n.address_size 64\n"
              b".visible .entry cd_graph_marker(.param .u64 p, .param .u32 v)\n{\n"
              b"  .reg .b32 %r<2>;\n  .reg .b64 %rd<2>;\n"
              b"  ld.param.u64 %rd1, [p];\n  ld.param.u32 %r1, [v];\n"
              b"  st.volatile.u32 [%rd1], %r1;\n  membar.sys;\n  ret;\n}\n")


def check(rc, what):
    if rc != 0:
        raise RuntimeError("%s -> %d" % (what, rc))


def graph_nodes(g):
    n = SZ(0)
    check(D["nodes"](g, None, ctypes.byref(n)), "cuGraphGetNodes")
    arr = (V * max(n.value, 1))()
    check(D["nodes"](g, arr, ctypes.byref(n)), "cuGraphGetNodes")
    return [arr[i] for i in range(n.value)]


def node_type(nd):
    t = I(-1)
    D["ntype"](nd, ctypes.byref(t))
    return t.value


def kernel_name(nd):
    p = KP()
    rc = D["kparams"](nd, ctypes.byref(p))
    if rc:
        return None, "params rc %d" % rc
    name = ctypes.c_char_p()
    if p.func:
        rc = D["fname"](ctypes.byref(name), p.func)
        how = "func"
    elif p.kern and D["kname"]:
        rc = D["kname"](ctypes.byref(name), p.kern)
        how = "kern"
    else:
        return None, "no func/kern"
    return (name.value.decode("utf-8", "replace") if rc == 0 and name.value else None), how


def capture_graph_of(stream):
    st, cid, g, deps, edges, nd = I(), U64(), V(), V(), V(), SZ()
    rc = D["getinfo"](V(stream), ctypes.byref(st), ctypes.byref(cid), ctypes.byref(g),
                      ctypes.byref(deps), ctypes.byref(edges), ctypes.byref(nd))
    return rc, st.value, cid.value, g.value, nd.value


# ------------------------------------------------------------------------ S1 ----
@section("S1")
def s1():
    import inspect
    import torch
    v = I()
    D["drvver"](ctypes.byref(v))
    r = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "driver": v.value,
         "python": sys.version.split()[0]}
    G = torch.cuda.CUDAGraph
    r["cudagraph_attrs"] = sorted(a for a in (
        "raw_cuda_graph", "raw_cuda_graph_exec", "capture_end_pre", "capture_end_post",
        "register_capture_end_hook", "register_post_instantiate_hook",
        "register_replay_start_hook", "instantiate", "enable_debug_mode", "debug_dump",
        "_has_graph_exec") if hasattr(G, a))
    r["cudagraph_py_methods"] = sorted(k for k in ("capture_begin", "capture_end", "replay",
                                                   "instantiate", "reset")
                                       if k in vars(G))
    try:
        r["keep_graph"] = "keep_graph" in str(inspect.signature(G.__new__)) or \
            "keep_graph" in (G.__doc__ or "")
    except (TypeError, ValueError):
        r["keep_graph"] = "keep_graph" in (G.__doc__ or "")
    try:
        r["graph_ctx_params"] = list(inspect.signature(torch.cuda.graph.__init__).parameters)
    except (TypeError, ValueError):
        r["graph_ctx_params"] = None
    import torch.cuda.graphs as tg
    r["global_hooks"] = [a for a in ("register_graph_instantiate_hook",
                                     "register_graph_destroy_hook") if hasattr(tg, a)]
    for m in ("torch.cuda.graph_annotations", "torch.cuda._graph_annotations"):
        try:
            __import__(m)
            r[m] = "importable"
        except Exception as e:
            r[m] = "no: %s" % type(e).__name__
    r["driver_exports"] = {name: hasattr(cu, name) for name in (
        "cuGraphNodeGetToolsId", "cuGraphExecGetId", "cuGraphGetId", "cuFuncGetName",
        "cuKernelGetName", "cuStreamGetCaptureInfo_v3", "cuGraphAddKernelNode_v2",
        "cuStreamUpdateCaptureDependencies_v2", "cuGraphKernelNodeGetParams_v2",
        "cuGraphGetEdges_v2")}
    OUT["S1"] = r
    for k, val in r.items():
        say("S1", k, "=", val)


# ------------------------------------------------------------------------ S2 ----
def transformer_step():
    import torch
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    x = torch.randn(16, 256, 512, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    return step, (model, opt, x)


KEEP = {}


@section("S2")
def s2():
    import torch
    import cuda_debug.testing as cdt
    G = torch.cuda.CUDAGraph
    orig = G.capture_end
    seen = []

    def capture_end(self):
        s = torch.cuda.current_stream().cuda_stream
        t0 = time.perf_counter()
        rc, st, cid, g, nd = capture_graph_of(s)
        t1 = time.perf_counter()
        entry = {"info_rc": rc, "status": st, "capture_id": cid, "frontier": nd}
        if rc == 0 and g:
            nodes = graph_nodes(g)
            t2 = time.perf_counter()
            kinds, names, hows = [], [], set()
            for n in nodes:
                t = node_type(n)
                kinds.append(t)
                if t == 0:
                    name, how = kernel_name(n)
                    names.append(name)
                    hows.add(how)
            t3 = time.perf_counter()
            entry.update(n_nodes=len(nodes), kinds={k: kinds.count(k) for k in set(kinds)},
                         names=names, how=sorted(hows), us_info=(t1 - t0) * 1e6,
                         us_get_nodes=(t2 - t1) * 1e6,
                         us_per_node_types_names=(t3 - t2) * 1e6 / max(len(nodes), 1))
        seen.append(entry)
        return orig(self)
    G.capture_end = capture_end
    try:
        x = torch.zeros(16, device="cuda")
        w = torch.randn(100, 8, device="cuda")
        idx = torch.zeros(1, dtype=torch.long, device="cuda")
        o = torch.empty(1, 8, device="cuda")
        a = torch.randn(64, 64, device="cuda")
        for _ in range(2):
            x.add_(1); x.mul_(2); torch.index_select(w, 0, idx, out=o); a @ a; x.sub_(1)
            cdt.empty(stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x.add_(1)
            x.mul_(2)
            torch.index_select(w, 0, idx, out=o)
            a @ a
            x.sub_(1)
            cdt.empty(stream=torch.cuda.current_stream().cuda_stream)
        small = seen[-1]
        say("S2", "small graph (add, mul, index_select, matmul, sub, raw empty): info rc",
            small["info_rc"], "nodes", small.get("n_nodes"), "kinds", small.get("kinds"),
            "how", small.get("how"))
        for i, n in enumerate(small.get("names") or []):
            say("S2", "  kernel node %d: %s" % (i, (n or "?")[:110]))
        try:
            exe = g.raw_cuda_graph_exec()
            say("S2", "raw_cuda_graph_exec after capture_end:", hex(exe) if exe else exe)
        except Exception as e:
            say("S2", "raw_cuda_graph_exec:", repr(e)[:120])
        step, keep = transformer_step()
        try:
            tg = torch.cuda.CUDAGraph(keep_graph=True)
            KEEP["keep_graph"] = True
        except TypeError:
            tg = torch.cuda.CUDAGraph()
            KEEP["keep_graph"] = False
        with torch.cuda.graph(tg):
            step()
        big = seen[-1]
        say("S2", "transformer step: nodes", big.get("n_nodes"), "kinds", big.get("kinds"),
            "us: info %.1f, get_nodes %.1f, per node (type+params+name) %.2f" % (
                big.get("us_info", -1), big.get("us_get_nodes", -1),
                big.get("us_per_node_types_names", -1)))
        KEEP["transformer"] = (tg, step, keep)
        OUT["S2"] = {"small": small, "transformer": {k: v for k, v in big.items()
                                                      if k != "names"}}
    finally:
        G.capture_end = orig
    # An NCCL collective of a single-rank group, captured.
    try:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                    device_id=torch.device("cuda", 0))
        t = torch.ones(1024, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        G.capture_end = capture_end
        try:
            ng = torch.cuda.CUDAGraph()
            with torch.cuda.graph(ng):
                dist.all_reduce(t)
                t.add_(1)
        finally:
            G.capture_end = orig
        e = seen[-1]
        say("S2", "nccl single rank: nodes", e.get("n_nodes"), "kinds", e.get("kinds"),
            "names", [(n or "?")[:70] for n in e.get("names") or []])
        ng.replay()
        torch.cuda.synchronize()
        OUT["S2"]["nccl"] = e
        KEEP["nccl"] = (ng, t)
    except Exception as e:
        say("S2", "nccl single rank: not captured:", repr(e)[:200])


# ------------------------------------------------------------------------ S3 ----
CUPTI_CHILD = textwrap.dedent(r"""
import ctypes, json, sys, time
config = sys.argv[1]
import torch
import cuda_debug
from cuda_debug import _core, _libraries
x = torch.zeros(1, device="cuda")
for _ in range(2000):
    x.add_(1)
torch.cuda.synchronize()
calls = [0]
if config != "plain":
    lib = _libraries.load("cupti")
    cupti = ctypes.CDLL(lib.path)
    CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)
    def on(ud, dom, cbid, data):
        calls[0] += 1
    cb = CB(on)
    sub = ctypes.c_void_p()
    rc = cupti.cuptiSubscribe(ctypes.byref(sub), cb, None)
    assert rc == 0, rc
    names = {v: k for k, v in _core.CALLBACK_IDS.items()}
    for n in ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuStreamBeginCapture_v2_ptsz",
              "cuStreamEndCapture_ptsz"):
        if n in names:
            cupti.cuptiEnableCallback(1, sub, 1, names[n])
    cupti.cuptiEnableDomain(1, sub, 3)          # resource
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    g.replay()
    torch.cuda.synchronize()
    if config == "after":
        assert cupti.cuptiUnsubscribe(sub) == 0
best = 1e9
for _ in range(5):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10000):
        x.add_(1)
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t0) / 10000)
print("RESULT " + json.dumps({"config": config, "us": best * 1e6, "callbacks": calls[0]}))
""")


@section("S3")
def s3():
    res = {}
    for rnd in range(2):
        for c in ("plain", "held", "after"):
            p = subprocess.run([sys.executable, "-c", CUPTI_CHILD, c], capture_output=True,
                               text=True, timeout=60)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if not line:
                say("S3", c, "child failed:", p.stderr[-400:])
                continue
            r = json.loads(line[0][7:])
            res.setdefault(c, []).append(r["us"])
            say("S3", "round", rnd, c, "%.3f us/op" % r["us"], "(callbacks seen %d)"
                % r["callbacks"])
    if "plain" in res:
        base = min(res["plain"])
        for c, v in res.items():
            say("S3", "%s best %.3f us, %.4fx plain" % (c, min(v), min(v) / base))
    OUT["S3"] = res


# ------------------------------------------------------------------------ S4 ----
class Markers:
    def __init__(self, n_slots=8192):
        p = V()
        check(D["hostalloc"](ctypes.byref(p), n_slots * 4, 0x01 | 0x02), "cuMemHostAlloc")
        self.host = (ctypes.c_uint32 * n_slots).from_address(p.value)
        dev = U64()
        check(D["hostdev"](ctypes.byref(dev), p, 0), "cuMemHostGetDevicePointer")
        self.dev = dev.value
        mod, fn = V(), V()
        check(D["modload"](ctypes.byref(mod), MARKER_PTX), "cuModuleLoadData")
        check(D["modfn"](ctypes.byref(fn), mod, b"cd_graph_marker"), "cuModuleGetFunction")
        self.fn = fn
        ctx = V()
        D["ctxget"](ctypes.byref(ctx))
        self.ctx = ctx
        self.n_slots = n_slots

    def kernel_node(self, g, deps, slot):
        ptr = U64(self.dev + slot * 4)
        val = ctypes.c_uint32(slot + 1)
        params = (V * 2)(ctypes.cast(ctypes.pointer(ptr), V), ctypes.cast(ctypes.pointer(val), V))
        kp = KP(func=self.fn, gx=1, gy=1, gz=1, bx=1, by=1, bz=1, shmem=0,
                params=ctypes.cast(params, V), extra=None, kern=None, ctx=None)
        node = V()
        arr = (V * max(len(deps), 1))(*deps)
        check(D["addk"](ctypes.byref(node), g, arr if deps else None, len(deps),
                        ctypes.byref(kp)), "cuGraphAddKernelNode")
        return node.value

    def clear_node(self, g, deps, n):
        mp = MP(dst=self.dev, pitch=0, value=0, elem=4, width=n, height=1)
        node = V()
        arr = (V * max(len(deps), 1))(*deps)
        check(D["addms"](ctypes.byref(node), g, arr, len(deps), ctypes.byref(mp), self.ctx),
              "cuGraphAddMemsetNode")
        return node.value


def dependents(nd):
    n = SZ(0)
    check(D["dependents"](nd, None, None, ctypes.byref(n)), "dependents")
    if n.value == 0:
        return []
    arr = (V * max(n.value, 1))()
    check(D["dependents"](nd, arr, None, ctypes.byref(n)), "dependents")
    return [arr[i] for i in range(n.value)]


def all_edges(g):
    n = SZ(0)
    check(D["edges"](g, None, None, None, ctypes.byref(n)), "edges")
    if n.value == 0:
        return []
    fr, to = (V * max(n.value, 1))(), (V * max(n.value, 1))()
    check(D["edges"](g, fr, to, None, ctypes.byref(n)), "edges")
    return [(fr[i], to[i]) for i in range(n.value)]


def build_variant(base, variant, mk, clear=True):
    """A clone of `base` with markers of `variant`; (graph, markers added)."""
    g = V()
    check(D["clone"](ctypes.byref(g), base), "cuGraphClone")
    g = g.value
    if variant == "none":
        return g, 0
    nodes = graph_nodes(g)
    kernels = [n for n in nodes if node_type(n) == 0]
    roots = set(nodes) - {t for _, t in all_edges(g)}
    slot = 0
    start = mk.kernel_node(g, [], slot)
    slot += 1
    for r in roots:
        check(D["adddep"](g, (V * 1)(start), (V * 1)(r), None, 1), "add start edge")
    every = 8 if variant.startswith("chain8") else 4 if variant.startswith("chain4") else 1
    prev_leaf = None
    for i, k in enumerate(kernels):
        if variant.startswith("chain") and i % every == every - 1:
            succ = dependents(k)
            if succ:
                n = len(succ)
                check(D["rmdep"](g, (V * n)(*([k] * n)), (V * n)(*succ), None, n), "rm")
            m = mk.kernel_node(g, [k], slot)
            slot += 1
            if succ:
                check(D["adddep"](g, (V * n)(*([m] * n)), (V * n)(*succ), None, n), "add")
        if variant in ("leaf", "leafchain", "chain8+leafchain") and \
                not (variant.startswith("chain8") and i % every == every - 1):
            deps = [k] + ([prev_leaf] if prev_leaf and variant != "leaf" else [])
            m = mk.kernel_node(g, deps, slot)
            slot += 1
            prev_leaf = m
    if clear:
        nodes = graph_nodes(g)
        sources = {f for f, _ in all_edges(g)}
        sinks = [n for n in nodes if n not in sources]
        mk.clear_node(g, sinks, slot)
    return g, slot


def time_exec(exe, stream, n):
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        D["launch"](exe, stream)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


VARIANTS = ["none", "chain1", "chain4", "chain8", "leaf", "leafchain", "chain8+leafchain"]


@section("S4")
def s4():
    import torch
    mk = Markers()
    res = {}
    graphs = {}
    if KEEP.get("keep_graph") and "transformer" in KEEP:
        graphs["transformer"] = (KEEP["transformer"][0].raw_cuda_graph(), 3, 20)
    xt = torch.zeros(1, device="cuda")
    for _ in range(3):
        xt.add_(1)
    torch.cuda.synchronize()
    tg = torch.cuda.CUDAGraph(keep_graph=True) if KEEP.get("keep_graph") else None
    if tg is not None:
        with torch.cuda.graph(tg):
            for _ in range(200):
                xt.add_(1)
        graphs["tiny200"] = (tg.raw_cuda_graph(), 20, 500)
        KEEP["tiny"] = (tg, xt)
    stream = torch.cuda.current_stream().cuda_stream
    execs = {}
    for gname, (base, _, _) in graphs.items():
        for v in VARIANTS:
            g, n_markers = build_variant(base, v, mk)
            exe = V()
            check(D["inst"](ctypes.byref(exe), g, 0), "instantiate %s %s" % (gname, v))
            execs[gname, v] = (exe.value, n_markers)
    # the markers are written: one replay of unclear'd variants
    for v in ("chain8", "leafchain"):
        if "tiny200" in graphs:
            g, n = build_variant(graphs["tiny200"][0], v, mk, clear=False)
            exe = V()
            check(D["inst"](ctypes.byref(exe), g, 0), "instantiate")
            for i in range(n):
                mk.host[i] = 0
            D["launch"](exe.value, stream)
            torch.cuda.synchronize()
            ok = sum(1 for i in range(n) if mk.host[i] == i + 1)
            say("S4", "tiny200 %s without the clear: %d of %d markers written" % (v, ok, n))
    for rnd in range(2):
        for gname, (_, warm, n) in graphs.items():
            for v in VARIANTS:
                exe, nm = execs[gname, v]
                time_exec(exe, stream, warm)
                t = time_exec(exe, stream, n)
                res.setdefault(gname, {}).setdefault(v, []).append(t * 1e3)
    for gname, d in res.items():
        base = min(d["none"])
        n_kernels = sum(1 for nd in graph_nodes(graphs[gname][0]) if node_type(nd) == 0)
        for v in VARIANTS:
            t = min(d[v])
            say("S4", "%-11s %-17s %.4f ms/replay  %.4fx  %+.3f us per kernel node" % (
                gname, v, t, t / base, (t - base) * 1e3 / n_kernels), "(%d markers)"
                % execs[gname, v][1])
    OUT["S4"] = res


# ------------------------------------------------------------------------ S5 ----
@section("S5")
def s5():
    import torch
    import cuda_debug
    from cuda_debug import _core, _locations, _report
    G = torch.cuda.CUDAGraph
    orig_replay = G.replay
    stacks = {}

    def describe_stack():
        f = sys._getframe(1)
        rows = []
        while f is not None:
            rows.append("%s:%d %s [%d]" % (os.path.basename(f.f_code.co_filename)[:40],
                                          f.f_lineno, f.f_code.co_name,
                                          _core.code_kind(f.f_code)))
            f = f.f_back
        return rows

    def replay(self):
        if "replay" not in stacks:
            stacks["replay"] = describe_stack()
        return orig_replay(self)
    G.replay = replay
    src = textwrap.dedent('''
    import torch
    @torch.compile(mode="reduce-overhead")
    def f(w, i):
        return w[i] * 2  # SOURCE
    ''')
    path = os.path.join(os.environ.get("OUT") or ".", "s5_compiled.py")
    with open(path, "w") as fh:
        fh.write(src)
    ns = {"__file__": path}
    exec(compile(src, path, "exec"), ns)
    f = ns["f"]
    w = torch.randn(100, 8, device="cuda")
    good = torch.zeros(4, dtype=torch.long, device="cuda")
    good2 = torch.ones(4, dtype=torch.long, device="cuda")
    try:
        with cuda_debug.watch():
            s0 = _core.watch_seq()
            y = f(w, good)                     # warm-up (eager under cudagraph trees)
            th = sys.modules.get("torch._inductor.runtime.triton_heuristics")
            at = getattr(th, "CachingAutotuner", None)
            orig_run = getattr(at, "run", None)
            if orig_run is not None:
                def run(self, *a, **kw):
                    if "kernel" not in stacks and torch.cuda.is_current_stream_capturing():
                        stacks["kernel"] = describe_stack()
                    return orig_run(self, *a, **kw)
                at.run = run
            try:
                for _ in range(3):
                    y = f(w, good)
            finally:
                if orig_run is not None:
                    at.run = orig_run
            torch.cuda.synchronize()
            s1 = _core.watch_seq()
            y = f(w, good2)
            torch.cuda.synchronize()
            s2 = _core.watch_seq()
    finally:
        G.replay = orig_replay
    say("S5", "python stack at CUDAGraph.replay (innermost first, [kind]); depth",
        len(stacks.get("replay", [])))
    for row in stacks.get("replay", [])[:80]:
        say("S5", "   ", row)
    say("S5", "python stack at a triton launch while recording (innermost first); depth",
        len(stacks.get("kernel", [])))
    for row in stacks.get("kernel", [])[:40]:
        say("S5", "   ", row)
    last_replay = None
    for seq in range(s1 + 1, s2 + 1):
        r = _report.watch_record(seq)
        if r is not None and r.flags & _core.WATCH_GRAPH:
            last_replay = r
    if last_replay is not None:
        st = _locations.stack_from_ids(last_replay.frames)
        say("S5", "ring record of the last replay: flags", last_replay.flags, "graph",
            last_replay.graph, "frames",
            [("%s:%d %s k%d" % (os.path.basename(x.filename), x.lineno, x.name,
                                _locations.frame_kind(x))) for x in st])
        d = _report._launch_dict(last_replay)
        say("S5", "  user frame ->", d["filename"], d["lineno"], d["function"], "compiled",
            d["compiled"])
    else:
        say("S5", "no graph replay in the ring between", s1, s2)
    stats = _core.graph_stats()
    say("S5", "graph_stats", stats)
    names = []
    for gi in range(0, 512):
        got = _core.graph_node(gi)
        if got is None:
            continue
        rec = _report.WatchRecord(*got[0])
        st = _locations.stack_from_ids(rec.frames)
        k = rec.kernel.decode()
        names.append(k)
        say("S5", "node", gi, "index", got[1], k[:60], "frames",
            [("%s:%d %s k%d" % (os.path.basename(x.filename), x.lineno, x.name,
                                _locations.frame_kind(x))) for x in st])
    cc = sys.modules.get("torch._inductor.codecache")
    pcc = getattr(cc, "PyCodeCache", None)
    say("S5", "PyCodeCache attrs", [a for a in ("modules", "linemaps", "modules_no_attr",
                                               "stack_frames_for_code", "cache")
                                    if hasattr(pcc, a)])
    mods = list(getattr(pcc, "modules", []) or [])
    in_sys = [m for m in sys.modules.values()
              if "torchinductor_" in (getattr(m, "__file__", None) or "")]
    say("S5", "inductor modules: PyCodeCache.modules", len(mods), "sys.modules", len(in_sys))
    for k in set(n for n in names if n.startswith("triton_")):
        where = [getattr(m, "__file__", "?") for m in mods + in_sys
                 if k in getattr(m, "__dict__", {})]
        say("S5", "kernel", k, "defined in", sorted(set(where))[:3])
        for path2 in sorted(set(where))[:1]:
            lines = open(path2).read().splitlines()
            calls = [i for i, l in enumerate(lines, 1)
                     if l.lstrip().startswith((k + ".run(", k + "("))]
            say("S5", "  call lines", calls[:3])
            try:
                fr = pcc.stack_frames_for_code(path2, calls[0]) if calls else None
                say("S5", "  stack_frames_for_code ->",
                    [(os.path.basename(x["filename"]), x["line"], x["name"])
                     for x in (fr or [])][:6])
            except Exception as e:
                say("S5", "  stack_frames_for_code failed", repr(e)[:120])
    tree = sys.modules.get("torch._inductor.cudagraph_trees")
    say("S5", "cudagraph_trees loaded:", tree is not None)
    OUT["S5"] = {"replay_depth": len(stacks.get("replay", [])), "nodes": names}


# ------------------------------------------------------------------------ S6 ----
RACE_CHILD = textwrap.dedent(r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[2])
import graphs_facts as P
import torch
variant = sys.argv[1]
xs = [torch.zeros(16, device="cuda") for _ in range(60)]
mk = P.Markers()
w = torch.randn(100, 8, device="cuda")
idx = torch.zeros(1, dtype=torch.long, device="cuda")
o = torch.empty(1, 8, device="cuda")
for i in range(60):
    xs[i].add_(1)
torch.index_select(w, 0, idx, out=o)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph(keep_graph=True)
with torch.cuda.graph(g):
    for i in range(60):
        if i == 37:
            torch.index_select(w, 0, idx, out=o)
        else:
            xs[i].add_(1)
base = g.raw_cuda_graph()
vg, n = P.build_variant(base, variant, mk, clear=False)
exe = P.V()
P.check(P.D["inst"](ctypes.byref(exe), vg, 0), "inst")
s = torch.cuda.current_stream().cuda_stream
P.D["launch"](exe.value, s)
torch.cuda.synchronize()
good = sum(1 for i in range(n) if mk.host[i] == i + 1)
for i in range(n):
    mk.host[i] = 0
idx.fill_(1000)
torch.cuda.synchronize()
P.D["launch"](exe.value, s)
try:
    torch.cuda.synchronize()
    err = None
except Exception as e:
    err = type(e).__name__
# slot 0 start; kernel k's marker: chain1 slot k+1; leafchain slot k+1
written = [i - 1 for i in range(1, n) if mk.host[i] == i + 1]
missing = [i - 1 for i in range(1, n) if mk.host[i] != i + 1]
print("RESULT " + json.dumps({"variant": variant, "good_written": good, "markers": n,
      "err": err, "first_missing_kernel": missing[0] if missing else None,
      "last_written_kernel": written[-1] if written else None}))
""")


@section("S6")
def s6():
    here = os.path.dirname(os.path.abspath(__file__))
    res = []
    for v in ["chain1", "leafchain", "leafchain", "leafchain"]:
        if elapsed() > 150:
            say("S6", "skipped the rest (time)")
            break
        p = subprocess.run([sys.executable, "-c", RACE_CHILD, v, here], capture_output=True,
                           text=True, timeout=60)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not line:
            say("S6", v, "child failed:", p.stderr[-400:])
            continue
        r = json.loads(line[0][7:])
        res.append(r)
        say("S6", json.dumps(r))
    OUT["S6"] = res


def main():
    s1()
    s2()
    s4()
    s3()
    s5()
    s6()
    say("END", "%.1f s" % elapsed())
    text = json.dumps(OUT, default=str)
    print("JSON " + text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "graphs_facts.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
