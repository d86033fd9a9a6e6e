#!/usr/bin/env python3
"""Generate the CUDA error table from the CUresult enum in cuda.h: one table,
two outputs, cuda_debug/_cuda_errors.py (names, descriptions, the sticky set)
and csrc/base/cuda_errors.h (the sticky set as an X-macro for the C fault path).

Usage:
    python3 tools/gen/cuda_errors.py              # write both
    python3 tools/gen/cuda_errors.py --check      # exit 1 if either is stale
    python3 tools/gen/cuda_errors.py --header PATH --out PATH --c-out PATH

The header defaults to the cuda.h that cuda_debug/_cuda_headers.py (the one
header search) finds.  The generated module is committed, so the
package needs no CUDA headers at run time.

Standard library only; Python 3.9+.
"""

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _gen_common  # noqa: E402  (this folder's shared part)

REPO_ROOT = _gen_common.REPO_ROOT
DEFAULT_OUT = REPO_ROOT / "cuda_debug" / "_cuda_errors.py"
DEFAULT_C_OUT = REPO_ROOT / "csrc" / "base" / "cuda_errors.h"

# ---------------------------------------------------------------------------
# Sticky errors
#
# A "sticky" error is one after which the CUDA context is unusable: every
# later CUDA call returns the same error and the process has to be restarted.
# The set is derived from the doc comments in cuda.h, which use a fixed
# wording for these codes.
# ---------------------------------------------------------------------------

STICKY_PHRASES = (
    "leaves the process in an inconsistent state",
    "context cannot be used anymore",
    "must be terminated and relaunched",
)

# The kernel faults everyone agrees on.  The generator fails if any of these
# is missing from the result (e.g. because NVIDIA reworded the docs).
REQUIRED_STICKY = {
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
}

# Codes beyond REQUIRED_STICKY that are sticky, each with the reason.
# Reviewed against cuda.h from CUDA 13.0 (CUDA_VERSION 13000):
#
# Matched by the phrases above, kept because the doc says outright that the
# process "must be terminated and relaunched":
#   226 CONTAINED            - device exception caught by the GPU's error
#                              containment (bad NVLink peer access, some
#                              hardware errors).
#   721 TENSOR_MEMORY_LEAK   - kernel exited without freeing tensor memory;
#                              a device-side fault like 700/714-719.
#   810 MPS_CLIENT_TERMINATED - the MPS server killed this client; nothing
#                              on this connection can work again.
#   911 EXTERNAL_DEVICE      - an external device signalled that shared data
#                              is invalid; same wording as the kernel faults.
#
# Not matched by any phrase, added by hand:
#   214 ECC_UNCORRECTABLE    - cuda.h only says "an uncorrectable ECC error
#                              was detected during execution"; it does not use
#                              the sticky wording.  In practice a double-bit
#                              ECC error corrupts memory owned by the running
#                              contexts, the driver marks them as faulted and
#                              every later call fails with 214, so the process
#                              must restart (and the page is retired / the GPU
#                              may need a reset).  Treated as sticky.
#
# Considered and left out:
#   220 NVLINK_UNCORRECTABLE - the hardware analogue of 214, but neither the
#                              doc nor our experience says the context is lost;
#                              on recent GPUs such faults surface as 226
#                              CONTAINED, which is sticky.
#   999 UNKNOWN              - "an unknown internal error"; not a kernel
#                              fault, and often transient or host side.
#   709 CONTEXT_IS_DESTROYED, 201 INVALID_CONTEXT - caller errors about a
#                              context handle, recoverable by using a valid one.
#   802 SYSTEM_NOT_READY     - its doc says "To continue using CUDA, verify the
#                              system configuration", which is why the phrases
#                              above are more specific than "to continue using
#                              CUDA".
#
# If a newer header makes a phrase match a code not listed here, the generator
# stops and asks for that code to be reviewed and added to one of these two
# tables.
EXTRA_STICKY = {
    214: "uncorrectable ECC error: the running contexts are faulted",
    226: "error containment: doc says terminate and relaunch",
    721: "tensor memory leak: doc says terminate and relaunch",
    810: "MPS client terminated: doc says terminate and relaunch",
    911: "external device error: doc says terminate and relaunch",
}

NOT_STICKY = {
    999: "unknown internal error: not a kernel fault",
}


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------

ENUM_RE = re.compile(
    r"typedef\s+enum\s+cudaError_enum\s*\{(?P<body>.*?)\}\s*CUresult\s*;", re.S
)
VERSION_RE = re.compile(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)\b", re.M)

# One token of the enum body.  Everything between tokens must be whitespace.
TOKEN_RE = re.compile(
    r"""
      /\*\*(?P<doc>.*?)\*/                        # doc comment
    | /\*.*?\*/                                   # plain comment
    | //[^\n]*                                    # line comment
    | (?P<name>[A-Za-z_]\w*)                      # enumerator
      (?:\s*=\s*(?P<value>[^,/]+?))?(?=\s*(?:,|/|$))
    | ,
    """,
    re.S | re.X,
)


def clean_doc(raw):
    """Turn the inside of a /** ... */ comment into one plain paragraph."""
    lines = []
    for line in raw.splitlines():
        line = line.strip()
        if line.startswith("*"):  # leading " * " of each comment line
            line = line[1:]
        lines.append(line.strip())
    text = " ".join(lines)
    # Drop "see also" and note tails.
    text = re.split(r"[\\@](?:sa|see|note)\b", text)[0]
    # \deprecated: the prose that follows already says "deprecated".
    text = re.sub(r"[\\@]deprecated\b", " ", text)
    # \p x, \e x, \c x, \b x, \a x, \ref x  ->  x
    text = re.sub(r"[\\@](?:p|e|c|b|a|ref)\s+", "", text)
    # ::cuStreamQuery()  ->  cuStreamQuery()
    text = re.sub(r"::(?=[A-Za-z_])", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    # A doc comment that is only "<" is a trailing /**< ... */ marker.
    if text.startswith("<"):
        text = text[1:].lstrip()
    return text


def _value_of(text, known):
    text = text.strip()
    if text in known:  # alias of an earlier enumerator
        return known[text]
    return int(text.rstrip("uUlL"), 0)


def parse_header(text):
    """Parse cuda.h text.

    Returns (cuda_version, errors) where errors maps code -> (name, description),
    sorted by code.
    """
    m = VERSION_RE.search(text)
    if not m:
        raise ValueError("no '#define CUDA_VERSION' in header")
    cuda_version = int(m.group(1))

    m = ENUM_RE.search(text)
    if not m:
        raise ValueError("no 'typedef enum cudaError_enum { ... } CUresult;' in header")
    body = m.group("body")

    entries = []  # [name, code, description]
    by_name = {}
    pending_doc = None
    next_value = 0
    pos = 0
    for tok in TOKEN_RE.finditer(body):
        gap = body[pos:tok.start()]
        if gap.strip():
            raise ValueError(f"cannot parse CUresult enum near {gap.strip()[:60]!r}")
        pos = tok.end()

        if tok.group("doc") is not None:
            raw = tok.group("doc")
            if raw.startswith("<") and entries:  # /**< doc */ after an enumerator
                entries[-1][2] = clean_doc(raw)
            else:
                pending_doc = clean_doc(raw)
        elif tok.group("name") is not None:
            name = tok.group("name")
            if tok.group("value") is not None:
                code = _value_of(tok.group("value"), by_name)
            else:
                code = next_value
            entries.append([name, code, pending_doc or ""])
            by_name[name] = code
            next_value = code + 1
            pending_doc = None
    if body[pos:].strip():
        raise ValueError(f"cannot parse CUresult enum near {body[pos:].strip()[:60]!r}")

    errors = {}
    for name, code, desc in entries:
        if code in errors:
            raise ValueError(
                f"{name} and {errors[code][0]} share code {code}; aliases are not supported"
            )
        errors[code] = (name, desc)
    if not errors:
        raise ValueError("CUresult enum is empty")
    return cuda_version, dict(sorted(errors.items()))


def phrase_matches(errors):
    """Codes whose description contains one of STICKY_PHRASES."""
    return {
        code
        for code, (_, desc) in errors.items()
        if any(p in desc.lower() for p in STICKY_PHRASES)
    }


def sticky_codes(errors, log=None):
    """Compute the sticky set for a parsed table; raise on anything unexpected.

    log, if given, is called with lines describing what was matched.
    """
    matched = phrase_matches(errors)
    present_extra = {c for c in EXTRA_STICKY if c in errors}
    sticky = (matched | present_extra) - set(NOT_STICKY)

    missing = set(REQUIRED_STICKY) - sticky
    if missing:  # an explicit raise, so that python -O cannot skip it
        raise AssertionError(
            "required sticky codes not found in the header docs: "
            + ", ".join(f"{c} {REQUIRED_STICKY[c]}" for c in sorted(missing))
        )

    unreviewed = matched - set(REQUIRED_STICKY) - set(EXTRA_STICKY) - set(NOT_STICKY)
    if unreviewed:
        raise SystemExit(
            "tools/gen/cuda_errors.py: the sticky phrases also matched codes nobody has reviewed: "
            + ", ".join(f"{c} {errors[c][0]}" for c in sorted(unreviewed))
            + "\nDecide whether each is sticky and add it to EXTRA_STICKY or NOT_STICKY"
            " in tools/gen/cuda_errors.py."
        )

    if log:
        log(f"sticky: {len(sticky)} codes; all {len(REQUIRED_STICKY)} required kernel faults "
            f"present; phrases matched {len(matched)}; other codes:")
        for code in sorted(sticky - set(REQUIRED_STICKY)):
            how = "phrase match" if code in matched else "added by hand"
            log(f"  sticky extra {code} {errors[code][0]} ({how}): {EXTRA_STICKY[code]}")
        for code in sorted(matched & set(NOT_STICKY)):
            log(f"  excluded {code} {errors[code][0]}: {NOT_STICKY[code]}")
    return frozenset(sticky)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

MODULE_CODE = '''

def name(code: int) -> str:
    """Enumerator name for a CUresult code, e.g. 710 -> "CUDA_ERROR_ASSERT"."""
    entry = ERRORS.get(code)
    return entry[0] if entry else f"CUDA_ERROR_{code}"


def description(code: int) -> str:
    """The cuda.h documentation for a CUresult code, as one paragraph."""
    entry = ERRORS.get(code)
    if entry:
        return entry[1]
    version = f"{CUDA_VERSION // 1000}.{CUDA_VERSION % 1000 // 10}"
    return f"unknown CUDA error {code} (not in the CUDA {version} headers)"


def is_sticky(code: int) -> bool:
    """True if the CUDA context is unusable after this error (restart needed)."""
    return code in STICKY


_CODES = {entry[0]: code for code, entry in ERRORS.items()}


def code_of(name: str) -> int:
    """CUresult code for an enumerator name; KeyError if unknown."""
    return _CODES[name]
'''


def render(cuda_version, errors, sticky):
    out = [
        f"# generated by tools/gen/cuda_errors.py from cuda.h CUDA_VERSION {cuda_version}"
        " \u2014 do not edit",
        '"""CUDA driver API error codes (the CUresult enum in cuda.h).',
        "",
        'PYTEST_DONT_REWRITE: pytest loads this package\'s plugin in every run (docs/pytest.md)."""',
        "",
        f"CUDA_VERSION = {cuda_version}",
        "",
        "# code: (name, description)",
        "ERRORS = {",
    ]
    for code, (name, desc) in sorted(errors.items()):
        out.append(f"    {code}: (")
        out.append(f"        {name!r},")
        out.append(f"        {desc!r},")
        out.append("    ),")
    out.append("}")
    out.append("")
    out.append("# Codes after which the context is unusable and the process must restart.")
    out.append("STICKY = frozenset({")
    for code in sorted(sticky):
        out.append(f"    {code},  # {errors[code][0]}")
    out.append("})")
    return "\n".join(out) + "\n" + MODULE_CODE


def render_c(cuda_version, errors, sticky):
    """csrc/base/cuda_errors.h: the sticky codes as an X-macro (base.h's cd_is_sticky)."""
    out = [
        f"/* generated by tools/gen/cuda_errors.py from cuda.h CUDA_VERSION {cuda_version}"
        " \u2014 do not edit */",
        "#ifndef CD_CUDA_ERRORS_H",
        "#define CD_CUDA_ERRORS_H",
        "",
        f"#define CD_ERRORS_CUDA_VERSION {cuda_version}",
        "",
        "/* Codes after which the context is unusable and the process must restart. */",
        "#define CD_STICKY_CODES(X) \\",
    ]
    for code in sorted(sticky):
        out.append(f"    X({code}) /* {errors[code][0]} */ \\")
    out.append("")
    out.append("#endif")
    return "\n".join(out) + "\n"


def generate(header_path, log=None):
    """(cuda_version, errors, sticky, Python module text, C header text)."""
    text = Path(header_path).read_text(encoding="utf-8", errors="replace")
    cuda_version, errors = parse_header(text)
    sticky = sticky_codes(errors, log=log)
    return (cuda_version, errors, sticky, render(cuda_version, errors, sticky),
            render_c(cuda_version, errors, sticky))


def default_header():
    """cuda.h as cuda_debug/_cuda_headers.py (the one header search) finds it."""
    search = _gen_common.header_search()
    dirs, tried = search.find(("cuda.h",))
    if not dirs:
        raise SystemExit("tools/gen/cuda_errors.py: cuda.h not found (cuda_debug/_cuda_headers.py looked "
                         "in: %s); pass --header PATH" % ", ".join(tried))
    return Path(search.header("cuda.h", dirs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--header", type=Path, help="path to cuda.h")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="module to write")
    ap.add_argument("--c-out", type=Path, default=DEFAULT_C_OUT, help="C header to write")
    ap.add_argument("--check", action="store_true", help=_gen_common.CHECK_HELP)
    args = ap.parse_args(argv)

    header = args.header or default_header()
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    cuda_version, errors, sticky, text, c_text = generate(header, log=log)
    return _gen_common.finish(__file__, [(args.out, text), (args.c_out, c_text)], args.check,
                              stamp="CUDA_VERSION %s" % cuda_version,
                              detail="%d codes, %d sticky, CUDA_VERSION %s"
                              % (len(errors), len(sticky), cuda_version))


if __name__ == "__main__":
    sys.exit(main())
