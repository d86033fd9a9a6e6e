"""The guard's oracle grid: every checked op on valid edge cases and invalid
inputs, built on any device (guard/test_guard_against_cpu_torch.py runs it on CPU with CPU
PyTorch as the oracle; guard/test_guard_on_cuda.py on CUDA, in a child process).

``cases(torch)`` yields ``Case``s; ``case.run(device)`` builds fresh inputs
(deterministic: the same tensors every call) and calls the op, returning what
to compare (the result, and the tensor an in-place op changed). ``case.error``
is the GuardError subclass name the guard must raise when the CPU op raises.

Left out on purpose: inputs PyTorch rejects on the host (wrong dtypes,
shapes), which fail the same way on every device; ``embedding_bag`` with
``offsets[0] != 0`` (CPU PyTorch rejects it, the CUDA kernel takes bag 0 from
0 whatever offsets[0] says: the guard leaves it to PyTorch) and with negative
offsets (CPU PyTorch reads before its input, no oracle: the guard rejects
them). guard/test_guard_against_cpu_torch.py tests both.
"""

N = 5                 # the size of the indexed dimension
INDEX_VALUES = (-100, -7, -6, -5, -4, -1, 0, 1, 4, 5, 6, 99, 2 ** 31 + 3)
INT_DTYPES = ("int64", "int32")


class Case:
    """`cuda_asserts`: CPU PyTorch accepts the input but the CUDA kernel asserts on
    it (a float32 row sum that overflows to inf in multinomial, seen on the
    H200): the guard refuses it, on the device's rules."""

    def __init__(self, op, name, run, error="GuardIndexError", cuda_asserts=False):
        self.op, self.name, self.run, self.error = op, name, run, error
        self.cuda_asserts = cuda_asserts

    def __repr__(self):
        return "<%s: %s>" % (self.op, self.name)


def _layouts(torch, values, dtype, device, shape=None):
    """The index tensor holding `values`, in several layouts: contiguous,
    non-contiguous (a transposed view), expanded (stride 0), 2-D."""
    def plain():
        return torch.tensor(values, dtype=dtype, device=device)

    def transposed():
        t = torch.tensor([values, values], dtype=dtype, device=device)
        return t.t()[:, 0]                        # stride 2: not contiguous

    def expanded():
        return torch.tensor(values[:1], dtype=dtype, device=device).expand(len(values))

    out = [("plain", plain), ("strided", transposed), ("expanded", expanded)]
    if shape is not None:
        out.append(("2d", lambda: plain().view(*shape)))
    return out


def _fits(dtype, v) -> bool:
    return dtype != "int32" or -2 ** 31 <= v < 2 ** 31


def _index_values(torch, dtype):
    return [v for v in INDEX_VALUES if _fits(dtype, v)]


def cases(torch):
    F = torch.nn.functional
    out = []
    add = out.append

    def x53(device, dtype=torch.float32):
        return torch.arange(15, dtype=dtype, device=device).view(5, 3) * 0.5 - 2

    for dtname in INT_DTYPES:
        dt = getattr(torch, dtname)
        for v in _index_values(torch, dtname):
            vals = [0, v, 2, 1]
            for lname, layout in _layouts(torch, vals, dt, "cpu", shape=(2, 2)):
                tag = "%s %s v=%s" % (dtname, lname, v)

                def idx(device, layout=layout):
                    return layout().to(device)

                # embedding: the rows of weight
                for pad in (None, 0, -1):
                    add(Case("embedding", "%s padding_idx=%s" % (tag, pad),
                             lambda d, idx=idx, pad=pad: F.embedding(idx(d), x53(d), padding_idx=pad)))
                add(Case("embedding", tag + " max_norm",
                         lambda d, idx=idx: _inplace(x53(d), lambda w: F.embedding(idx(d), w, max_norm=1.0))))
                # index_select, index_add/copy/fill: dimension 0 of (5, 3), dimension 1 of (3, 5)
                if lname != "2d":
                    add(Case("index_select", tag, lambda d, idx=idx: x53(d).index_select(0, idx(d))))
                    add(Case("index_select", tag + " dim=-1",
                             lambda d, idx=idx: torch.index_select(x53(d).t(), -1, idx(d))))
                    add(Case("index_add", tag, lambda d, idx=idx: _inplace(
                        x53(d), lambda x: x.index_add_(0, idx(d), torch.ones(4, 3, device=d)))))
                    add(Case("index_add", tag + " torch.", lambda d, idx=idx: torch.index_add(
                        x53(d), 0, idx(d), torch.ones(4, 3, device=d), alpha=2)))
                    if dtname == "int64":    # (index_fill: int64 only)
                        add(Case("index_fill", tag, lambda d, idx=idx: _inplace(
                            x53(d), lambda x: x.index_fill_(0, idx(d), -1.0))))
                        add(Case("index_fill", tag + " dim=1", lambda d, idx=idx: torch.index_fill(
                            x53(d).t(), 1, idx(d), 7.0)))
                    if dtname == "int64":    # (take, take_along_dim: int64 only)
                        add(Case("take", tag + " (x3)", lambda d, idx=idx: torch.take(x53(d), idx(d) * 3)))
                        add(Case("take_along_dim", tag + " dim=None x3",
                                 lambda d, idx=idx: torch.take_along_dim(x53(d), idx(d) * 3)))
                # gather / scatter*: an index of shape (2, 2) on dimension 0 of (5, 3)
                if lname == "2d" or lname == "plain":
                    def g_index(d, idx=idx):
                        return idx(d).reshape(2, 2) if dtname == "int64" else idx(d).reshape(2, 2).long()
                    if dtname == "int64" or lname == "plain":
                        add(Case("gather", tag, lambda d, gi=g_index: x53(d).gather(0, gi(d))))
                        add(Case("gather", tag + " dim=1 (3, 5)",
                                 lambda d, gi=g_index: torch.gather(x53(d).t(), 1, gi(d).t())))
                        add(Case("take_along_dim", tag + " dim=0", lambda d, gi=g_index: torch.take_along_dim(
                            x53(d)[:, :2], gi(d), 0)))
                        add(Case("take_along_dim", tag + " dim=-1 broadcast", lambda d, gi=g_index:
                                 x53(d).t().take_along_dim(gi(d)[:1], -1)))
                        add(Case("scatter", tag + " src", lambda d, gi=g_index: torch.scatter(
                            x53(d), 0, gi(d), torch.ones(2, 2, device=d))))
                        add(Case("scatter", tag + " value_", lambda d, gi=g_index: _inplace(
                            x53(d), lambda x: x.scatter_(0, gi(d), 3.0))))
                        add(Case("scatter_add", tag, lambda d, gi=g_index: _inplace(
                            x53(d), lambda x: x.scatter_add_(0, gi(d), torch.ones(2, 2, device=d)))))
                        add(Case("scatter_add", tag + " torch.", lambda d, gi=g_index: torch.scatter_add(
                            x53(d), 0, gi(d), torch.ones(2, 2, device=d))))
                        for red in ("sum", "amax"):
                            add(Case("scatter_reduce", tag + " " + red, lambda d, gi=g_index, red=red: _inplace(
                                x53(d), lambda x: x.scatter_reduce_(0, gi(d), torch.ones(2, 2, device=d),
                                                                    red, include_self=False))))
                # indexing: x[idx], x[:, idx], x[idx, idx], x[..., idx], x[None, idx]
                add(Case("index", tag + " x[i]", lambda d, idx=idx: x53(d)[idx(d)]))
                add(Case("index", tag + " x[:, i] on (5, 6)",
                         lambda d, idx=idx: torch.cat([x53(d)] * 2, 1)[:, idx(d)]))
                add(Case("index", tag + " x[i, i%3]", lambda d, idx=idx: x53(d)[idx(d), idx(d) % 3]))
                add(Case("index", tag + " x[..., i] (5, 5)",
                         lambda d, idx=idx: x53(d).repeat(1, 2)[..., :5][..., idx(d)]))
                add(Case("index", tag + " x[None, i]", lambda d, idx=idx: x53(d)[None, idx(d)]))
                add(Case("index", tag + " x[1:, i] on (5, 5)",
                         lambda d, idx=idx: x53(d).repeat(1, 2)[1:, :5][:, idx(d)]))
                add(Case("index", tag + " x[mask, i]", lambda d, idx=idx: x53(d).view(1, 5, 3)[
                    torch.tensor([True], device=d), idx(d)]))
                add(Case("index", tag + " x[i] = 1", lambda d, idx=idx: _inplace(
                    x53(d), lambda x: x.__setitem__(idx(d), 1.0))))
                add(Case("index", tag + " x[:, i] = t", lambda d, idx=idx: _inplace(
                    x53(d).t().contiguous(), lambda x: x.__setitem__((slice(None), idx(d)), torch.tensor(2.0, device=d)))))
                add(Case("index_put", tag + " (i,)", lambda d, idx=idx: _inplace(
                    x53(d), lambda x: x.index_put_((idx(d),), torch.tensor(1.0, device=d), accumulate=True))))
                add(Case("index_put", tag + " (j, i) on (3, 5)", lambda d, idx=idx: torch.index_put(
                    x53(d).t().contiguous(), (torch.arange(idx(d).numel(), device=d).view(idx(d).shape) % 3,
                                              idx(d)), torch.tensor(1.0, device=d))))
            # lists of ints are index tensors too
            add(Case("index", "%s list v=%s" % (dtname, v), lambda d, v=v: x53(d)[[0, v, 1]]))
            add(Case("index", "%s x[:, [v]]" % dtname, lambda d, v=v: x53(d).t()[:, [v, 0]]))
            if dtname == "int64":
                add(Case("index_copy", "v=%s" % v, lambda d, v=v: _inplace(
                    x53(d), lambda x: x.index_copy_(0, torch.tensor([v, 2] if v != 2 else [v], device=d),
                                                    torch.ones(2 if v != 2 else 1, 3, device=d)))))
                add(Case("index_copy", "v=%s torch." % v, lambda d, v=v: torch.index_copy(
                    x53(d), 0, torch.tensor([v], device=d), torch.ones(1, 3, device=d))))
                add(Case("take", "v=%s" % v, lambda d, v=v: torch.take(x53(d), torch.tensor([0, v], device=d))))
                add(Case("take", "0-d v=%s" % v, lambda d, v=v: x53(d).take(torch.tensor(v, device=d))))
            add(Case("index", "0-d v=%s" % v, lambda d, v=v, dt=dt: x53(d)[torch.tensor(v, dtype=dt, device=d)]))
            add(Case("index_select", "0-d v=%s" % v, lambda d, v=v, dt=dt: x53(d).index_select(
                0, torch.tensor(v, dtype=dt, device=d))))

    out += _embedding_bag_cases(torch)
    out += _loss_cases(torch)
    out += _one_hot_cases(torch)
    out += _bce_cases(torch)
    out += _multinomial_cases(torch)
    out += _empty_cases(torch)
    return out


def _inplace(x, fn):
    """An in-place op's result and the tensor it changed."""
    r = fn(x)
    return r, x


def _embedding_bag_cases(torch):
    F = torch.nn.functional
    out = []

    def w(d):
        return torch.arange(15.0, device=d).view(5, 3)
    for dtname in INT_DTYPES:
        dt = getattr(torch, dtname)
        for v in _index_values(torch, dtname):
            for mode in ("sum", "mean", "max"):
                out.append(Case("embedding_bag", "%s v=%s %s" % (dtname, v, mode), lambda d, v=v, dt=dt, mode=mode:
                                F.embedding_bag(torch.tensor([1, v, 0, 3], dtype=dt, device=d), w(d),
                                                torch.tensor([0, 2], dtype=dt, device=d), mode=mode)))
            out.append(Case("embedding_bag", "%s v=%s 2-d padding_idx=4" % (dtname, v), lambda d, v=v, dt=dt:
                            F.embedding_bag(torch.tensor([[1, v], [4, 0]], dtype=dt, device=d), w(d),
                                            padding_idx=4)))
            out.append(Case("embedding_bag", "%s v=%s per_sample_weights" % (dtname, v), lambda d, v=v, dt=dt:
                            F.embedding_bag(torch.tensor([v, 2, 3], dtype=dt, device=d), w(d),
                                            torch.tensor([0, 1], dtype=dt, device=d), mode="sum",
                                            per_sample_weights=torch.tensor([1.0, 2.0, 3.0], device=d))))
            out.append(Case("embedding_bag", "%s v=%s nn.EmbeddingBag" % (dtname, v), lambda d, v=v, dt=dt:
                            _module(torch.nn.EmbeddingBag(5, 3), d)(
                                torch.tensor([v, 2, 3], dtype=dt, device=d), torch.tensor([0, 1], dtype=dt, device=d))))
        # offsets: bag b is input[offsets[b]:offsets[b + 1]]; offsets[0] is 0 (see the module doc)
        # (negative offsets are left out: CPU PyTorch reads before input, whatever is there)
        for offs in ((0,), (0, 0), (0, 4), (0, 5), (0, 1, 1), (0, 3, 2), (0, 2, 1, 3),
                     (0, 2, 6), (0, 4, 4), (0, 0, 0), (0, 1, 2, 3, 4)):
            err = "GuardValueError" if any(b < a for a, b in zip(offs[1:], offs[2:])) and \
                all(0 <= o <= 4 for o in offs) else "GuardIndexError"
            for incl in (False, True):
                if incl and len(offs) < 2:
                    continue
                out.append(Case("embedding_bag", "%s offsets=%s include_last_offset=%s" % (dtname, offs, incl),
                                lambda d, offs=offs, dt=dt, incl=incl: F.embedding_bag(
                                    torch.tensor([1, 0, 2, 3], dtype=dt, device=d), w(d),
                                    torch.tensor(offs, dtype=dt, device=d), mode="sum",
                                    include_last_offset=incl), error=err))
    return out


def _module(m, device):
    import torch
    torch.manual_seed(0)
    for p in m.parameters():
        with torch.no_grad():
            p.copy_(torch.arange(p.numel(), dtype=p.dtype).view(p.shape) * 0.25)
    return m.to(device)


def _loss_cases(torch):
    F = torch.nn.functional
    out = []

    def logits(d, *shape):
        n = 1
        for s in shape:
            n *= s
        return torch.sin(torch.arange(n, dtype=torch.float32, device=d)).view(*shape)
    for v in (-101, -100, -99, -2, -1, 0, 1, 2, 3, 4, 255):
        for ign in (-100, 1, 3, -1, 2 ** 40):
            for fname in ("nll_loss", "cross_entropy"):
                # looked up at each call: guard() wraps F's functions at its first entry
                def fn(*args, fname=fname, **kwargs):
                    return getattr(F, fname)(*args, **kwargs)
                for red in ("mean", "none", "sum"):
                    out.append(Case(fname, "v=%s ignore_index=%s %s" % (v, ign, red),
                                    lambda d, v=v, ign=ign, fn=fn, red=red, fname=fname: fn(
                                        logits(d, 4, 3).log_softmax(1) if fname == 'nll_loss' else logits(d, 4, 3),
                                        torch.tensor([0, v, 2, 1], device=d), ignore_index=ign,
                                        reduction=red)))
                out.append(Case(fname, "v=%s ignore_index=%s weight" % (v, ign),
                                lambda d, v=v, ign=ign, fn=fn: fn(logits(d, 4, 3), torch.tensor([0, v, 2, 1], device=d),
                                                                 weight=torch.tensor([1.0, 2.0, 0.5], device=d),
                                                                 ignore_index=ign)))
                out.append(Case(fname, "v=%s ignore_index=%s 1-d input, 0-d target" % (v, ign),
                                lambda d, v=v, ign=ign, fn=fn: fn(logits(d, 3), torch.tensor(v, device=d),
                                                                 ignore_index=ign)))
                out.append(Case(fname, "v=%s ignore_index=%s 4-d (nll_loss2d)" % (v, ign),
                                lambda d, v=v, ign=ign, fn=fn: fn(logits(d, 2, 3, 2, 2),
                                                                 torch.tensor([0, 1, 2, 0, 1, v, 0, 0], device=d).view(2, 2, 2),
                                                                 ignore_index=ign)))
                out.append(Case(fname, "v=%s ignore_index=%s 5-d, strided target" % (v, ign),
                                lambda d, v=v, ign=ign, fn=fn: fn(logits(d, 2, 3, 2, 1, 2),
                                                                 torch.tensor([[0, 1, 2, 0], [1, v, 0, 0]],
                                                                              device=d).t().reshape(2, 2, 1, 2),
                                                                 ignore_index=ign)))
            out.append(Case("cross_entropy", "v=%s ignore_index=%s label_smoothing" % (v, ign),
                            lambda d, v=v, ign=ign: F.cross_entropy(logits(d, 4, 3), torch.tensor([0, v, 2, 1], device=d),
                                                                   ignore_index=ign, label_smoothing=0.1)))
            out.append(Case("cross_entropy", "v=%s ignore_index=%s label_smoothing weight" % (v, ign),
                            lambda d, v=v, ign=ign: F.cross_entropy(
                                logits(d, 4, 3), torch.tensor([0, v, 2, 1], device=d),
                                weight=torch.tensor([1.0, 2.0, 0.5], device=d), ignore_index=ign,
                                label_smoothing=0.2, reduction="sum")))
            out.append(Case("cross_entropy", "v=%s ignore_index=%s nn.CrossEntropyLoss" % (v, ign),
                            lambda d, v=v, ign=ign: torch.nn.CrossEntropyLoss(ignore_index=ign)(
                                logits(d, 4, 3), torch.tensor([0, v, 2, 1], device=d))))
            out.append(Case("nll_loss", "v=%s ignore_index=%s nn.NLLLoss" % (v, ign),
                            lambda d, v=v, ign=ign: torch.nn.NLLLoss(ignore_index=ign)(
                                logits(d, 4, 3), torch.tensor([0, v, 2, 1], device=d))))
            if 0 <= v <= 255:
                out.append(Case("nll_loss", "uint8 v=%s ignore_index=%s" % (v, ign),
                                lambda d, v=v, ign=ign: F.nll_loss(logits(d, 4, 3), torch.tensor(
                                    [0, v, 2, 1], dtype=torch.uint8, device=d), ignore_index=ign)))
    # probabilities as targets: no class index, nothing to check (any values)
    for scale in (1.0, -1.0, 3.0):
        out.append(Case("cross_entropy", "probabilities x%s" % scale, lambda d, scale=scale: F.cross_entropy(
            logits(d, 4, 3), logits(d, 4, 3).softmax(1) * scale, label_smoothing=0.1)))
    return out


def _one_hot_cases(torch):
    F = torch.nn.functional
    out = []
    for v in (-5, -1, 0, 1, 2, 3, 4, 100):
        for nc in (3, 5, -1):
            out.append(Case("one_hot", "v=%s num_classes=%s" % (v, nc), lambda d, v=v, nc=nc: F.one_hot(
                torch.tensor([0, v, 1], device=d), nc)))
            out.append(Case("one_hot", "v=%s num_classes=%s 2-d strided" % (v, nc), lambda d, v=v, nc=nc: F.one_hot(
                torch.tensor([[0, v], [1, 0]], device=d).t(), nc)))
    out.append(Case("one_hot", "empty num_classes=3", lambda d: F.one_hot(
        torch.zeros(0, dtype=torch.long, device=d), 3)))
    return out


def _bce_cases(torch):
    F = torch.nn.functional
    out = []
    nan = float("nan")
    for dtname in ("float32", "float64"):
        dt = getattr(torch, dtname)
        for x in (0.0, 0.25, 1.0, -0.0, -1e-7, 1.0000001, 1.5, -3.0, nan, float("inf")):
            for y in (0.0, 0.5, 1.0, 1.5, -0.5, nan):
                out.append(Case("binary_cross_entropy", "%s input=%s target=%s" % (dtname, x, y),
                                lambda d, x=x, y=y, dt=dt: F.binary_cross_entropy(
                                    torch.tensor([0.5, x, 0.25], dtype=dt, device=d),
                                    torch.tensor([0.0, y, 1.0], dtype=dt, device=d)),
                                error="GuardValueError"))
            out.append(Case("binary_cross_entropy", "%s input=%s weight none strided" % (dtname, x),
                            lambda d, x=x, dt=dt: F.binary_cross_entropy(
                                torch.tensor([[0.5, x], [0.25, 0.75]], dtype=dt, device=d).t(),
                                torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=dt, device=d),
                                weight=torch.tensor([1.0, 2.0], dtype=dt, device=d), reduction="none"),
                            error="GuardValueError"))
            out.append(Case("binary_cross_entropy", "%s input=%s nn.BCELoss" % (dtname, x),
                            lambda d, x=x, dt=dt: torch.nn.BCELoss()(
                                torch.tensor([0.5, x], dtype=dt, device=d).expand(3, 2),
                                torch.tensor([0.0, 1.0], dtype=dt, device=d).expand(3, 2)),
                            error="GuardValueError"))
    return out


def _multinomial_cases(torch):
    out = []
    nan, inf = float("nan"), float("inf")
    rows = {"ok": [[0.2, 0.8, 0.0], [1.0, 1.0, 1.0]], "zero weight": [[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]],
            "negative": [[0.2, -0.1, 0.5], [1.0, 1.0, 1.0]], "nan": [[0.2, nan, 0.5], [1.0, 1.0, 1.0]],
            "inf": [[0.2, 0.3, 0.5], [inf, 1.0, 1.0]], "zero row": [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]],
            "-0 row": [[-0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], "tiny": [[1e-30, 0.0, 0.0], [1.0, 2.0, 3.0]],
            "huge": [[3e38, 3e38, 0.0], [1.0, 1.0, 1.0]]}
    for name, r in rows.items():
        for n, repl in ((1, False), (1, True), (2, True), (4, True), (2, False)):
            out.append(Case("multinomial", "%s n=%d replacement=%s" % (name, n, repl),
                            lambda d, r=r, n=n, repl=repl: _seeded(torch, d, lambda g: torch.multinomial(
                                torch.tensor(r, device=d), n, repl, generator=g)), error="GuardValueError",
                            cuda_asserts=name == "huge"))
            out.append(Case("multinomial", "%s 1-d n=%d replacement=%s" % (name, n, repl),
                            lambda d, r=r, n=n, repl=repl: _seeded(torch, d, lambda g: torch.tensor(
                                r[0], device=d).multinomial(n, repl, generator=g)), error="GuardValueError",
                            cuda_asserts=name == "huge"))
        out.append(Case("multinomial", "%s float64 strided" % name,
                        lambda d, r=r: _seeded(torch, d, lambda g: torch.multinomial(
                            torch.tensor(r, dtype=torch.float64, device=d).t().contiguous().t(), 2, True,
                            generator=g)), error="GuardValueError"))
    return out


def _seeded(torch, device, fn):
    g = torch.Generator(device=device)
    g.manual_seed(1234)
    return fn(g)


def _empty_cases(torch):
    """Empty tensors: nothing to check, the op's own result."""
    F = torch.nn.functional
    e = torch.long
    return [
        Case("embedding", "empty input", lambda d: F.embedding(torch.zeros(0, dtype=e, device=d),
                                                               torch.ones(5, 3, device=d))),
        Case("index_select", "empty index", lambda d: torch.ones(5, 3, device=d).index_select(
            0, torch.zeros(0, dtype=e, device=d))),
        Case("index_select", "empty input and index", lambda d: torch.ones(0, 3, device=d).index_select(
            0, torch.zeros(0, dtype=e, device=d))),
        Case("gather", "empty index", lambda d: torch.ones(5, 3, device=d).gather(
            0, torch.zeros(0, 3, dtype=e, device=d))),
        Case("index", "x[empty]", lambda d: torch.ones(5, 3, device=d)[torch.zeros(0, dtype=e, device=d)]),
        Case("index", "empty x[empty]", lambda d: torch.ones(0, 3, device=d)[torch.zeros(0, dtype=e, device=d)]),
        Case("take", "empty", lambda d: torch.take(torch.ones(0, device=d), torch.zeros(0, dtype=e, device=d))),
        Case("nll_loss", "empty batch", lambda d: F.nll_loss(torch.ones(0, 3, device=d),
                                                             torch.zeros(0, dtype=e, device=d), reduction="sum")),
        Case("cross_entropy", "empty batch", lambda d: F.cross_entropy(torch.ones(0, 3, device=d),
                                                                       torch.zeros(0, dtype=e, device=d),
                                                                       reduction="none")),
        Case("binary_cross_entropy", "empty", lambda d: F.binary_cross_entropy(
            torch.ones(0, device=d), torch.ones(0, device=d), reduction="sum")),
        Case("index_add", "empty index", lambda d: torch.ones(5, 3, device=d).index_add_(
            0, torch.zeros(0, dtype=e, device=d), torch.ones(0, 3, device=d))),
        Case("scatter", "empty index", lambda d: torch.ones(5, 3, device=d).scatter_(
            0, torch.zeros(0, 3, dtype=e, device=d), 1.0)),
        Case("embedding_bag", "empty input", lambda d: F.embedding_bag(
            torch.zeros(0, dtype=e, device=d), torch.ones(5, 3, device=d), torch.zeros(2, dtype=e, device=d))),
    ]


def compare(torch, a, b):
    """Equal results (nan equal to nan); tuples element by element."""
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            compare(torch, x, y)
        return
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (a, b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a, b)
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return
    assert a == b, (a, b)
