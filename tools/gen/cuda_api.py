#!/usr/bin/env python3
"""Generate csrc/base/cuda_api.h: the declarations of the CUDA driver API,
CUPTI and cuBLAS/cuBLASLt that csrc/ uses, taken from the real headers, so
that building cuda_debug needs no CUDA toolkit and no NVIDIA header wheel
(the libraries themselves are opened at run time).

Usage:
    python3 tools/gen/cuda_api.py              # write csrc/base/cuda_api.h
    python3 tools/gen/cuda_api.py --check      # exit 1 if it is stale
    python3 tools/gen/cuda_api.py --probe DIR  # write the ABI probes (tests)
    python3 tools/gen/cuda_api.py --include DIR [--include DIR ...] --out PATH

How: the C compiler preprocesses cuda.h, cupti.h, cublas_api.h and cublasLt.h
(`cc -E -dD`, the build's -std=gnu11, for this machine: 64-bit Linux), which
resolves their #if branches and keeps their macros. Every identifier that
csrc/*.c and csrc/*/*.[ch] name, and the fake driver of the CPU tests
(tests/fake_cuda/*.[ch], built against this header too), comments and strings
left out, and that one of those headers defines is a root; each root brings its declaration or macro,
and everything that declaration names, until nothing new comes in. Structs,
unions and prototypes are copied whole, token for token; an enum keeps only
the enumerators csrc/ names plus its smallest and largest (so the compiler
gives it the same underlying type), each with its value written out. The
header version (CUDA_VERSION, CUPTI_API_VERSION, CUBLAS_VER_*) is stamped at
the top. The headers are found by cuda_debug/_cuda_headers.py (the one
search), or given with --include.

The ABI is proved by tests/house/test_cuda_api.py: the probe (--probe) prints the
size, alignment and field offsets of every struct, the size and signedness of
every type and the value of every enumerator and macro of the header; it is
compiled once against the real headers and once against this one, and the
outputs must be equal; the prototypes and typedefs are also redeclared after
the real headers, which the compiler refuses if any differs.

Standard library only; Python 3.9+.
"""

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _gen_common  # noqa: E402  (this folder's shared part)
from c_decls import (  # noqa: E402  (C declarations, token by token)
    KEYWORDS, TAG_KEYWORDS, tokenize, is_ident, strip_c_comments_and_strings, Macro, group_end,
    split_top, skip_attributes, Decl, parse_preprocessed)

REPO_ROOT = _gen_common.REPO_ROOT
CSRC = REPO_ROOT / "csrc"
DEFAULT_OUT = CSRC / "base" / "cuda_api.h"
# The fake libcuda/libcupti of the tests (CPU-only CI) are compiled against this
# header too, so that they build where no CUDA toolkit is: what they name is kept.
FAKES = REPO_ROOT / "tests" / "fake_cuda"
HEADERS = ("cuda.h", "cupti.h", "cublas_api.h", "cublasLt.h")
# Outputs of generators: never roots (cuda_api.h is this file's own output).
NOT_SCANNED = {"base/cuda_api.h", "testing/fault_kernels_ptx.h"}
# The system headers the declarations lean on (size_t, uint32_t...): the
# generated header includes these; a type from any other fails its compile.
SYSTEM_HEADERS = ("stddef.h", "stdint.h")

# ---------------------------------------------------------------------------
# Values of enumerators and macros
# ---------------------------------------------------------------------------

def int_literal(tok):
    t = tok.rstrip("uUlL")
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", t):
        return int(t, 16)
    if re.fullmatch(r"0[0-7]*", t):
        return int(t, 8)
    if re.fullmatch(r"[1-9]\d*", t):
        return int(t)
    raise ValueError(tok)


def evaluate(tokens, known, macros, seen=()):
    """The value of an integer constant expression of names in `known` and
    object-like `macros`; ValueError when it is none."""
    py = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "(" and i + 2 < len(tokens) and tokens[i + 2] == ")" and tokens[i + 1] in (
                "int", "unsigned", "long", "uint32_t", "int32_t", "uint64_t", "int64_t"):
            i += 3                                      # a cast to an integer type
            continue
        if is_ident(t):
            if t in known:
                py.append("(%d)" % known[t])
            elif t in macros and macros[t].params is None and t not in seen:
                py.append("(%d)" % evaluate(macros[t].tokens, known, macros, seen + (t,)))
            else:
                raise ValueError(t)
        elif t[0].isdigit():
            py.append(str(int_literal(t)))
        elif t in ("+", "-", "*", "%", "<<", ">>", "|", "&", "^", "~", "(", ")"):
            py.append(t)
        elif t == "/":
            py.append("//")
        else:
            raise ValueError(t)
        i += 1
    tree = ast.parse(" ".join(py) or "x", mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        raise ValueError(" ".join(tokens))
    return eval(compile(tree, "<enum>", "eval"), {"__builtins__": {}})  # noqa: S307 (checked above)


def enum_values(decls, macros):
    """{enumerator: value} over every enum of the headers, in order."""
    known = {}
    for d in decls:
        for _, _, items in d.enums:
            nxt = 0
            for name, value in items:
                if value is not None:
                    try:
                        nxt = evaluate(value, known, macros)
                    except ValueError:
                        nxt = None
                elif nxt is None:
                    raise ValueError("tools/gen/cuda_api.py: %s follows an enumerator of unknown value" % name)
                if nxt is not None:
                    known[name] = nxt
                    nxt += 1
    return known


# ---------------------------------------------------------------------------
# What csrc/ uses
# ---------------------------------------------------------------------------

def csrc_identifiers(csrc=CSRC, fakes=FAKES):
    """{identifier or 'tag:X': [files]} named by the C sources of csrc/ and of the
    fake CUDA driver (tests/fake_cuda/, built from this header too)."""
    out = {}
    paths = sorted(list(csrc.glob("*.[ch]")) + list(csrc.glob("*/*.[ch]")))
    paths += sorted(fakes.glob("*.[ch]")) if fakes is not None else []
    for path in paths:
        rel = path.relative_to(csrc).as_posix() if csrc in path.parents else \
            path.relative_to(REPO_ROOT).as_posix()
        if rel in NOT_SCANNED:
            continue
        toks = tokenize(strip_c_comments_and_strings(path.read_text(encoding="utf-8")))
        for i, t in enumerate(toks):
            if is_ident(t):
                key = "tag:" + t if i and toks[i - 1] in TAG_KEYWORDS else t
                out.setdefault(key, []).append(rel)
    return out


class Model:
    """What goes in the header: macros, declarations, enumerators kept."""

    def __init__(self, macros, decls, used):
        self.macros, self.decls = macros, decls
        self.values = enum_values(decls, macros)
        defs = {}
        for d in decls:
            for n in d.names:
                defs.setdefault(n, d)
            for t in d.tags:
                defs.setdefault("tag:" + t, d)
        self.enumerators = set()
        chosen_macros, chosen_decls = {}, {}
        work = [n for n in used if n in macros or n in defs]
        self.roots = sorted(set(work))
        while work:
            n = work.pop()
            if n in chosen_macros or (n in defs and id(defs[n]) in chosen_decls and
                                      (n not in self.values or n in self.enumerators)):
                continue
            if n in macros:
                chosen_macros[n] = macros[n]
                work.extend(r for r in macros[n].refs if r in macros or r in defs)
                continue
            d = defs[n]
            if n in self.values:
                self.enumerators.add(n)
            if id(d) not in chosen_decls:
                chosen_decls[id(d)] = d
                work.extend(r for r in d.refs() if r in defs or r in macros)
        self.chosen_macros = chosen_macros
        self.chosen = sorted(list(chosen_macros.values()) + list(chosen_decls.values()),
                             key=lambda x: x.order)
        for d in chosen_decls.values():
            for _, _, items in d.enums:
                vals = [(self.values[n], n) for n, _ in items if n in self.values]
                if len(vals) != len(items):
                    unknown = [n for n, _ in items if n not in self.values]
                    raise SystemExit("tools/gen/cuda_api.py: enumerators of unknown value: %s" % unknown)
                self.enumerators.update((min(vals)[1], max(vals)[1]))


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

NO_SPACE_BEFORE = {",", ";", ")", "]", "[", "->", ".", "++", "--"}
NO_SPACE_AFTER = {"(", "[", "->", ".", "~", "!"}


def join_tokens(tokens):
    out = ""
    prev = None
    for t in tokens:
        if prev is None:
            out = t
        elif (t in NO_SPACE_BEFORE or prev in NO_SPACE_AFTER
              or (t == "(" and (is_ident(prev) and prev not in KEYWORDS
                                or prev in (")", "__attribute__", "sizeof")))
              or (prev == "*" and (is_ident(t) or t in ("*", ")")))):
            out += t
        else:
            out += " " + t
        prev = t
    return out


def render_decl(d, keep, values):
    """The declaration, one member a line, enums cut to `keep` (with their
    `values` written out)."""
    toks = list(d.tokens)
    for start, end, items in reversed(d.enums):        # enum bodies: written out, cut
        kept = [(n, v) for n, v in items if n in keep]
        body = ["{"]
        for n, _ in kept:
            body += ["@NL", n, "=", "@VAL:" + n, ","]
        toks[start:end] = body + ["@NL", "}"]
    lines, cur, level = [], [], 0

    def flush():
        if cur:
            lines.append("    " * level + join_tokens(cur))
            cur.clear()

    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "@NL":
            flush()
        elif t.startswith("@VAL:"):
            v = values[t[5:]]
            cur.append(str(v if -65536 < v < 65536 or v < 0 else hex(v)))
        elif t == "{":
            cur.append("{")
            flush()
            level += 1
        elif t == "}":
            flush()
            level -= 1
            cur.append("}")
        elif t == ";" and level > 0:
            cur.append(";")
            flush()
        else:
            cur.append(t)
        i += 1
    flush()
    out = []
    for line in lines:                                  # long prototypes: one parameter a line
        if len(line) > 100 and "(" in line and d.kind == "function":
            head, _, rest = line.partition("(")
            params = [join_tokens(p) for p in split_top(tokenize(rest[:rest.rindex(")")]), ",")]
            tail = rest[rest.rindex(")"):]
            out.append(head + "(" + (",\n" + " " * (len(head) + 1)).join(params) + tail)
        else:
            out.append(line)
    return "\n".join(out)


def versions(macros):
    def v(name):
        m = macros.get(name)
        return m.body if m else "?"
    return ("CUDA_VERSION %s, CUPTI_API_VERSION %s, cuBLAS %s.%s.%s"
            % (v("CUDA_VERSION"), v("CUPTI_API_VERSION"), v("CUBLAS_VER_MAJOR"),
               v("CUBLAS_VER_MINOR"), v("CUBLAS_VER_PATCH")))


def render(model, include_dirs):
    stamp = versions(model.macros)
    out = [
        "/* generated by tools/gen/cuda_api.py from the CUDA headers (%s)"
        " \u2014 do not edit */" % stamp,
        "/*",
        " * The CUDA driver API, CUPTI and cuBLAS/cuBLASLt declarations that csrc/ uses",
        " * (and the tests' fake driver, tests/fake_cuda/), copied from cuda.h, cupti.h,",
        " * cublas_api.h and cublasLt.h as preprocessed for 64-bit Linux: csrc/ includes",
        " * this instead of them, so the build needs no CUDA toolkit (the libraries are",
        " * opened at run time). Enums keep only the enumerators csrc/ and the fakes name,",
        " * plus their smallest and largest (the same underlying type).",
        " * tests/house/test_cuda_api.py compares its ABI with the real headers'.",
        " */",
        "#ifndef CD_CUDA_API_H",
        "#define CD_CUDA_API_H",
        "",
        "#if !defined(__linux__) || !defined(__LP64__)",
        '#error "csrc/base/cuda_api.h holds the CUDA declarations of 64-bit Linux"',
        "#endif",
        "",
    ] + ["#include <%s>" % h for h in SYSTEM_HEADERS] + [""]
    last = None
    for item in model.chosen:
        where = _short_origin(item.origin, include_dirs)
        if where != last:
            out.append("/* %s */" % where)
            last = where
        if isinstance(item, Macro):
            out.append(item.text())
        else:
            out.append(render_decl(item, model.enumerators, model.values))
    out += ["", "#endif", ""]
    return "\n".join(out)


def _short_origin(origin, include_dirs):
    for d in include_dirs:
        try:
            return Path(os.path.realpath(origin)).relative_to(os.path.realpath(d)).as_posix()
        except ValueError:
            continue
    return os.path.basename(origin)


# ---------------------------------------------------------------------------
# The ABI probe (tests/house/test_cuda_api.py)
# ---------------------------------------------------------------------------

def probe_source(model):
    """C source printing one 'what name value' line per fact of the header's
    ABI; compiled with -DCD_PROBE_REAL it includes the real headers instead."""
    lines = [
        "/* generated by tools/gen/cuda_api.py --probe: the ABI of csrc/base/cuda_api.h */",
        "#include <stdio.h>", "#include <stddef.h>", "#include <stdint.h>",
        "#ifdef CD_PROBE_REAL",
    ] + ["#include <%s>" % h for h in HEADERS] + [
        "#else", '#include "base/cuda_api.h"', "#endif",
        "#define CD_S_(x) #x", "#define CD_S(x) CD_S_(x)",
        "int main(void)", "{",
    ]
    p = lines.append

    def layout(ctype, label, body):
        p('    printf("size %s %%zu\\n", sizeof(%s));' % (label, ctype))
        p('    printf("align %s %%zu\\n", _Alignof(%s));' % (label, ctype))
        for f in member_names(body):
            p('    printf("offset %s.%s %%zu\\n", offsetof(%s, %s));' % (label, f, ctype, f))

    complete = complete_typedefs(model)
    laid_out = set()
    for d in model.chosen:
        if isinstance(d, Macro):
            if d.params is None:
                p('    printf("macro %s %%s\\n", CD_S(%s));' % (d.name, d.name))
            continue
        for kw, tag, body, names in d.aggregates:
            if kw == "enum":
                continue
            if tag:
                layout("%s %s" % (kw, tag), "%s:%s" % (kw, tag), body)
            for n in names:
                layout(n, n, body)
                laid_out.add(n)
        for n in sorted(d.typedefs):
            if n in complete and n not in laid_out:
                p('    printf("size %s %%zu\\n", sizeof(%s));' % (n, n))
                if complete[n] == "integer":
                    p('    printf("signed %s %%d\\n", (int)((%s)-1 < 0));' % (n, n))
        for _, _, items in d.enums:
            for name, _ in items:
                if name in model.enumerators:
                    p('    printf("enum %s %%lld\\n", (long long)%s);' % (name, name))
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def redeclaration_source(model):
    """C source that includes the real headers and then redeclares the
    header's prototypes, body-less typedefs and macros: the compiler refuses
    (with -Werror, for macros) any that differs from the real one."""
    lines = ["/* generated by tools/gen/cuda_api.py --probe: csrc/base/cuda_api.h's",
             " * prototypes, typedefs and macros, redeclared after the real headers */"]
    lines += ["#include <%s>" % h for h in HEADERS]
    for d in model.chosen:
        if isinstance(d, Macro):
            lines.append(d.text())
        elif d.kind == "function" or (d.kind == "typedef" and not d.aggregates):
            lines.append(render_decl(d, model.enumerators, model.values))
    lines.append("int cd_redeclared_everything;")
    return "\n".join(lines) + "\n"


def member_names(body):
    """Names of the members of a struct/union body offsetof can take (an
    anonymous struct/union member's own, bit-fields left out)."""
    out = []
    for m in split_top(body, ";"):
        m = skip_attributes(m)
        if not m or ":" in m:
            continue
        if m[0] in ("struct", "union") and "{" in m and m[-1] == "}":
            start = m.index("{")
            out += member_names(m[start + 1:-1])        # anonymous: its members are ours
            continue
        nested = []
        if m[0] in ("struct", "union") and "{" in m:      # struct {...} name: name.x too
            start = m.index("{")
            nested = member_names(m[start + 1:group_end(m, start) - 1])
        for k, dcl in enumerate(split_top(Decl._collapse_bodies(m), ",")):
            name = Decl._declarator_name(dcl if k else dcl[1:] if len(dcl) > 1 else dcl)
            if name:
                out.append(name)
                if "[" not in dcl:
                    out += ["%s.%s" % (name, sub) for sub in nested]
    return out


BUILTIN_SCALARS = {"char", "short", "int", "long", "unsigned", "signed", "float", "double",
                   "_Bool", "size_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "int8_t",
                   "int16_t", "int32_t", "int64_t", "uintptr_t", "intptr_t"}
FLOATS = {"float", "double"}


def complete_typedefs(model):
    """{typedef name: 'integer' | 'other'} of the header's typedefs with a
    size (object types, not functions or incomplete structs)."""
    out = {}
    defined_tags = {t for d in model.chosen if isinstance(d, Decl) for t in d.tags}
    for _ in range(4):                                  # typedefs of typedefs
        for d in model.chosen:
            if not isinstance(d, Decl):
                continue
            for n, dcl in d.typedefs.items():
                body = skip_attributes(dcl)
                words = [t for t in body if is_ident(t) and t not in ("typedef", "const", n)]
                if "*" in body and not ("(" in body and "*" not in body[body.index("("):]):
                    out[n] = "other"                    # a pointer
                elif "(" in body:
                    continue                            # a function type
                elif "{}" in body:
                    out[n] = "integer" if body[body.index("{}") - 1] == "enum" or (
                        len(body) > 2 and body[body.index("{}") - 2] == "enum") else "other"
                elif words and words[0] in TAG_KEYWORDS:
                    if len(words) > 1 and words[1] in defined_tags:
                        out[n] = "integer" if words[0] == "enum" else "other"
                elif words and all(w in BUILTIN_SCALARS for w in words):
                    out[n] = "other" if set(words) & FLOATS else "integer"
                elif len(words) == 1 and words[0] in out:
                    out[n] = out[words[0]]
    return out


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

def find_include_dirs():
    search = _gen_common.header_search()
    dirs, tried = search.find(HEADERS)
    if not dirs:
        raise SystemExit("tools/gen/cuda_api.py: the CUDA headers %s were not all found together "
                         "(cuda_debug/_cuda_headers.py looked in: %s); pass --include DIR"
                         % (", ".join(HEADERS), ", ".join(tried)))
    return dirs


def preprocess(include_dirs, cc=None):
    cc = cc or os.environ.get("CC") or "cc"
    if not shutil.which(cc):
        raise SystemExit("tools/gen/cuda_api.py: no C compiler %r to preprocess the headers" % cc)
    src = "".join("#include <%s>\n" % h for h in HEADERS)
    cmd = [cc, "-E", "-dD", "-std=gnu11", "-x", "c", "-"] + ["-I" + d for d in include_dirs]
    p = subprocess.run(cmd, input=src, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("tools/gen/cuda_api.py: %s failed:\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    return p.stdout


def build_model(include_dirs, csrc=CSRC, cc=None):
    roots = [os.path.realpath(d) + os.sep for d in include_dirs]

    def is_cuda(path):
        return bool(path) and os.path.realpath(path).startswith(tuple(roots))

    macros, decls = parse_preprocessed(preprocess(include_dirs, cc), is_cuda)
    return Model(macros, decls, csrc_identifiers(csrc))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", action="append", help="a folder of the CUDA headers")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="header to write")
    ap.add_argument("--probe", type=Path, metavar="DIR",
                    help="write the ABI probes (abi_probe.c, redeclare.c) to DIR instead")
    ap.add_argument("--check", action="store_true", help=_gen_common.CHECK_HELP)
    args = ap.parse_args(argv)
    dirs = args.include or find_include_dirs()
    model = build_model(dirs)
    if args.probe:
        args.probe.mkdir(parents=True, exist_ok=True)
        (args.probe / "abi_probe.c").write_text(probe_source(model), encoding="utf-8")
        (args.probe / "redeclare.c").write_text(redeclaration_source(model), encoding="utf-8")
        print("wrote %s/abi_probe.c and redeclare.c (%s)" % (args.probe, versions(model.macros)))
        return 0
    n_decls = sum(isinstance(x, Decl) for x in model.chosen)
    detail = "%d declarations, %d macros, %d enumerators from %d roots (%s)" % (
        n_decls, len(model.chosen_macros), len(model.enumerators), len(model.roots),
        versions(model.macros))
    return _gen_common.finish(__file__, [(args.out, render(model, dirs))], args.check,
                              stamp=versions(model.macros), detail=detail)


if __name__ == "__main__":
    sys.exit(main())
