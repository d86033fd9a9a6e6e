"""Where in a kernel: a PC offset in a cubin turned into its source line.

``cuda-debug replay`` knows the faulting access's offset from the kernel's
first instruction (_replay.BadAccess.pc_offset) and keeps the culprit module's
image (csrc/replay: the Sanitizer API's module-load callback hands it over).
This module maps the two to a line:

1. CUPTI's ``cuptiGetSassToSourceCorrelation`` (the library the package
   loads anyway; it reads the cubin's line table offline, no GPU or context
   needed): file, folder and line;
2. ``nvdisasm -g -c`` where it is installed (the CUDA toolkit, or the
   nvidia-cuda-nvdisasm wheel): the instruction at the offset, and the
   inline chain (``inlined at``) CUPTI does not give.

A kernel built without line info (PyTorch's own) keeps its function, offset
and instruction, and the hint says how to get a line. Nothing here raises:
a missing library or tool leaves its fields None.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import re
import shutil
import subprocess
import sys
from typing import List, NamedTuple, Optional, Tuple

#: The ELF magic of a cubin, and a fatbinary's (a module loaded from a fatbin).
ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = b"\x50\xed\x55\xba"
#: Source files read for a line's text: at most this many bytes.
SOURCE_MAX = 8 << 20
#: nvdisasm's run, at most (seconds) and its output read (bytes).
NVDISASM_TIMEOUT = 20
NVDISASM_OUTPUT_MAX = 64 << 20

HINT = ("the kernel has no line info: build it with -lineinfo (nvcc -lineinfo; CuPy "
        "RawKernel(..., options=(\"-lineinfo\",)); torch.utils.cpp_extension "
        "extra_cuda_cflags=[\"-lineinfo\"]) to get its source line")


class KernelLine(NamedTuple):
    function: str                    # the kernel (mangled, as the module has it)
    offset: int                      # the PC offset from its first instruction
    file: Optional[str]              # the source file (the folder joined when relative)
    line: Optional[int]
    source: Optional[str]            # the line's text, where the file is readable
    inlined: Tuple[Tuple[str, int, str], ...]   # (file, line, function), innermost call first
    instruction: Optional[str]       # SASS at the offset (nvdisasm)
    how: str                         # "CUPTI", "nvdisasm", "CUPTI and nvdisasm" or ""
    note: Optional[str]              # the hint without line info, or why nothing is known

    def location(self) -> Optional[str]:
        return "%s:%d" % (self.file, self.line) if self.file and self.line else None

    def as_dict(self) -> dict:
        d = self._asdict()
        d["inlined"] = [list(i) for i in self.inlined]
        return d


def short_name(name: str) -> str:
    """A kernel's name for a line: demangled, without its parameter list."""
    try:
        from . import _core
        d = _core.demangle(name) or name
    except Exception:
        d = name
    d = d[5:] if d.startswith("void ") else d
    return (d.split("(")[0].strip() or d)[:120]


def text(k: "KernelLine", short=short_name) -> str:
    """``in the kernel: prog.py:6  tl.store(p + offs, ...)`` with the inline
    chain, or ``in the kernel: store_past+0x1a0 (STG.E ...)`` and the hint.
    `short`: kernel name shortener."""
    if k.file and k.line:
        out = "in the kernel: %s:%d" % (k.file, k.line)
        if k.source:
            out += "  " + k.source
        else:
            out += "  (the source file is not on disk)"
        for f, n, fn in k.inlined:
            out += "\n  inlined at %s:%d%s" % (f, n, " in " + fn if fn else "")
        if k.note:
            out += "\n  (%s)" % k.note
        return out
    out = "in the kernel: %s+0x%x" % (short(k.function), k.offset)
    if k.instruction:
        out += " (%s)" % k.instruction
    if k.note:
        out += "\n  " + k.note
    return out


# -- the image ----------------------------------------------------------------------

def elf_image(image: bytes) -> Optional[bytes]:
    """The cubin in `image`: itself when it is an ELF; None otherwise (a
    fatbinary or PTX: the module-load callback hands over what was loaded)."""
    return image if image[:4] == ELF_MAGIC else None


# -- CUPTI -------------------------------------------------------------------------

_cupti = None                     # (the CDLL, or False when none was found)


def _cupti_library(path: Optional[str] = None):
    global _cupti
    import ctypes
    if path is not None:
        try:
            return ctypes.CDLL(path)
        except OSError:
            return None
    if _cupti is not None:
        return _cupti or None
    # (a soname finds the copy already loaded: the one cuda_debug or PyTorch opened)
    names = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            names += [os.path.join(root, d, "libcupti.so") for d in
                      ("lib", "lib64", os.path.join("extras", "CUPTI", "lib64"))]
    for n in dict.fromkeys(names):
        try:
            lib = ctypes.CDLL(n)
        except OSError:
            continue
        if hasattr(lib, "cuptiGetSassToSourceCorrelation"):
            _cupti = lib
            return lib
    _cupti = False
    return None


def cupti_line(cubin: bytes, function: str, offset: int,
               library: Optional[str] = None) -> Optional[Tuple[str, str, int]]:
    """(file, folder, line) of `offset` in `function` by CUPTI's
    cuptiGetSassToSourceCorrelation, or None (no CUPTI, no line info)."""
    import ctypes
    lib = _cupti_library(library)
    f = getattr(lib, "cuptiGetSassToSourceCorrelation", None) if lib is not None else None
    if f is None:
        return None

    class Params(ctypes.Structure):        # CUpti_GetSassToSourceCorrelationParams
        _fields_ = [("size", ctypes.c_size_t), ("cubin", ctypes.c_void_p),
                    ("functionName", ctypes.c_char_p), ("cubinSize", ctypes.c_size_t),
                    ("lineNumber", ctypes.c_uint32), ("pcOffset", ctypes.c_uint64),
                    ("fileName", ctypes.c_void_p), ("dirName", ctypes.c_void_p)]

    f.argtypes = [ctypes.POINTER(Params)]
    f.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(cubin, len(cubin))
    p = Params(ctypes.sizeof(Params), ctypes.cast(buf, ctypes.c_void_p), function.encode(),
               len(cubin), 0, offset, None, None)
    try:
        rc = f(ctypes.byref(p))
    except Exception:
        return None
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]

    def take(ptr) -> str:
        if not ptr:
            return ""
        s = ctypes.string_at(ptr, 4096).split(b"\0", 1)[0].decode("utf-8", "replace")
        free(ptr)
        return s
    name, folder = take(p.fileName), take(p.dirName)
    if rc != 0 or not p.lineNumber or not name:
        return None
    return name, folder, int(p.lineNumber)


# -- nvdisasm -----------------------------------------------------------------------

def find_nvdisasm() -> Optional[str]:
    """nvdisasm on PATH, in $CUDA_HOME/$CUDA_PATH/bin, /usr/local/cuda/bin, or
    NVIDIA's wheel (nvidia-cuda-nvdisasm)."""
    hit = shutil.which("nvdisasm")
    if hit:
        return hit
    dirs = [os.path.join(r, "bin") for r in (os.environ.get("CUDA_HOME"),
                                             os.environ.get("CUDA_PATH"), "/usr/local/cuda") if r]
    import site
    try:
        site_dirs = site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:             # (a virtualenv's old site module)
        site_dirs = []
    site_dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for site_dir in dict.fromkeys(site_dirs):
        dirs += [os.path.join(site_dir, "nvidia", sub, "bin")
                 for sub in ("cu13", "cuda_nvdisasm", "cu12")]
    for d in dirs:
        p = os.path.join(d, "nvdisasm")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


_FUNC = re.compile(r"^\s*\.text\.(\S+):\s*$|^\s*\.section\s+\.text\.([^,\s]+)")
_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;?\s*(?:/\*.*)?$")
_LINE = re.compile(r'^\s*//##\s*File\s+"([^"]+)",\s*line\s+(\d+)(.*)$')
_INLINED = re.compile(r'inlined at\s+"([^"]+)",\s*line\s+(\d+)')


def nvdisasm_at(cubin: bytes, function: str, offset: int, exe: Optional[str] = None):
    """(instruction, [(file, line, rest)...]) at `offset` of `function` from
    ``nvdisasm -gi -c`` (the ``//## File "...", line N`` lines above the
    instruction: the first its own line, with any ``inlined at`` chain in
    `rest`, then the callers' lines); None when nvdisasm is not found or fails."""
    exe = exe or find_nvdisasm()
    if not exe:
        return None
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        try:
            p = subprocess.run([exe, "-gi", "-c", path], capture_output=True,
                               timeout=NVDISASM_TIMEOUT)
        except (OSError, subprocess.SubprocessError):
            return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    if p.returncode != 0:
        return None
    return parse_nvdisasm(p.stdout[:NVDISASM_OUTPUT_MAX].decode("utf-8", "replace"),
                          function, offset)


def parse_nvdisasm(out: str, function: str, offset: int):
    """(instruction, lines) at `offset` in `function` of nvdisasm -gi output:
    the block of ``//##`` lines last seen above the instruction (a block
    holds for the instructions after it until the next one)."""
    in_fn = False
    block: List[Tuple[str, int, str]] = []
    current: List[Tuple[str, int, str]] = []
    for raw in out.splitlines():
        m = _FUNC.match(raw)
        if m:
            in_fn = (m.group(1) or m.group(2)) == function
            block, current = [], []
            continue
        if not in_fn:
            continue
        m = _LINE.match(raw)
        if m:
            block.append((m.group(1), int(m.group(2)), m.group(3).strip()))
            continue
        m = _INSN.match(raw)
        if m:
            if block:
                current, block = block, []
            if int(m.group(1), 16) == offset:
                insn = re.sub(r"\s+", " ", m.group(2)).strip().rstrip(";").strip()
                return insn[:120], list(current)
    return None


# -- the source text ------------------------------------------------------------------

def source_line(path: str, line: int) -> Optional[str]:
    """Line `line` of the regular file `path` (at most SOURCE_MAX bytes read),
    stripped and cut to 160 characters; None when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        try:                          # a symlinked file is fine to read, not a fifo/device
            fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
    try:
        import stat
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, SOURCE_MAX)
    except OSError:
        return None
    finally:
        os.close(fd)
    rows = data.decode("utf-8", "replace").splitlines()
    if not 1 <= line <= len(rows):
        return None
    s = rows[line - 1].strip()
    return (s[:157] + "...") if len(s) > 160 else s


# -- the lookup -------------------------------------------------------------------------

def lookup(image: Optional[bytes], function: str, offset: Optional[int],
           cupti: Optional[str] = None, nvdisasm: Optional[str] = None,
           use_nvdisasm: bool = True) -> Optional[KernelLine]:
    """The KernelLine of `offset` in `function` of module `image`, or None
    when neither is known."""
    if offset is None or not function:
        return None
    if not image:
        return KernelLine(function, offset, None, None, None, (), None, "",
                          "the kernel's module image was not kept, so its line is not known")
    cubin = elf_image(image)
    if cubin is None:
        return KernelLine(function, offset, None, None, None, (), None, "",
                          "the kernel's module was not loaded as a cubin, so its line is not "
                          "known")
    hows = []
    file = line = None
    got = cupti_line(cubin, function, offset, cupti)
    folder = None
    if got:
        name, folder, line = got
        file = name if os.path.isabs(name) or not folder else os.path.join(folder, name)
        hows.append("CUPTI")
    insn, inlined = None, ()
    dis = nvdisasm_at(cubin, function, offset, nvdisasm) if use_nvdisasm else None
    if dis is not None:
        insn, dlines = dis
        hows.append("nvdisasm")
        if dlines:
            f0, n0, rest = dlines[0]
            if file is None:
                file = f0 if os.path.isabs(f0) or not folder else os.path.join(folder, f0)
                line = n0
            inlined = tuple((f, int(n), "") for f, n in _INLINED.findall(rest))
    source = source_line(file, line) if file and line else None
    note = None if line else HINT
    return KernelLine(function, offset, file, line, source, inlined, insn,
                      " and ".join(hows), note)
