"""The launch hooks' promise to the libraries whose import tables they write
(SPEC section 16; csrc/base/got.c), against the fake CUDA driver: CPU only.

- A library unloaded while a watch() is open is not written when the watch
  ends: not into its unmapped pages (SIGSEGV), not into whatever was mapped at
  its address since (memory of someone else's).
- The page of a GOT entry keeps the protection it had: where RELRO ends inside
  a page (the last page holds .got.plt and .data, writable; real on 64 KiB-page
  aarch64 kernels for objects linked for 4 KiB pages), the library's next data
  write after the watch must not fault. Emulated on x86 by lengthening a
  library's PT_GNU_RELRO to end mid-page: the loader then protects only the
  whole pages (it rounds the end down), as it does there.

Each case runs in a child: the failure these guard against kills the process.
"""
import os
import shutil
import struct
import subprocess

import pytest

from fake_cuda import LIBRTUSER, HERE, cflags, compiler

PT_GNU_RELRO = 0x6474E552
SHT_RELA = 4
PAGE = os.sysconf("SC_PAGESIZE")


# -- reading (and patching) an ELF64 little-endian shared object ---------------------

class Elf:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = bytearray(f.read())
        d = self.data
        assert d[:4] == b"\x7fELF" and d[4] == 2 and d[5] == 1, "an ELF64 LSB object"
        self.phoff, self.shoff = struct.unpack_from("<QQ", d, 0x20)
        self.phentsize, self.phnum, self.shentsize, self.shnum, shstrndx = \
            struct.unpack_from("<HHHHH", d, 0x36)
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", d, self.shoff + i * self.shentsize)
                         for i in range(self.shnum)]
        names = self.sections[shstrndx]
        self.by_name = {self._str(names[4], s[0]): s for s in self.sections}

    def _str(self, table_off, i):
        end = self.data.index(b"\0", table_off + i)
        return self.data[table_off + i:end].decode()

    def phdrs(self):
        """(index, p_type, p_vaddr, p_memsz) of each program header."""
        out = []
        for i in range(self.phnum):
            p_type, _, _, p_vaddr, _, _, p_memsz, _ = struct.unpack_from(
                "<IIQQQQQQ", self.data, self.phoff + i * self.phentsize)
            out.append((i, p_type, p_vaddr, p_memsz))
        return out

    def relro(self):
        (i, _, vaddr, memsz), = [p for p in self.phdrs() if p[1] == PT_GNU_RELRO]
        return i, vaddr, memsz

    def set_relro_size(self, size):
        i, _, _ = self.relro()
        at = self.phoff + i * self.phentsize
        struct.pack_into("<QQ", self.data, at + 32, size, size)    # p_filesz, p_memsz

    def got_slots(self, symbol):
        """The offsets of the relocations (JUMP_SLOT, GLOB_DAT) against `symbol`."""
        out = []
        for s in self.sections:
            if s[1] != SHT_RELA:
                continue
            symtab = self.sections[s[6]]
            strtab = self.sections[symtab[6]]
            for k in range(s[5] // 24):
                r_offset, r_info, _ = struct.unpack_from("<QQq", self.data, s[4] + 24 * k)
                sym = r_info >> 32
                if not sym:
                    continue
                st_name = struct.unpack_from("<I", self.data, symtab[4] + 24 * sym)[0]
                if self._str(strtab[4], st_name) == symbol:
                    out.append(r_offset)
        return out

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.data)


def _page(a):
    return a - a % PAGE


@pytest.fixture(scope="module")
def libraries(fake_cuda_dir, tmp_path_factory):
    """{variant: (path, the __cudaLaunchKernel slot's offset)}: the fake
    runtime's user library as built (lazy binding: its slot in .got.plt, past
    RELRO), fully RELRO (-z now: its slot inside RELRO, a read-only page), and
    with its RELRO lengthened to end inside the .got.plt/.data page."""
    work = tmp_path_factory.mktemp("relro")
    built = os.path.join(fake_cuda_dir, LIBRTUSER)
    out = {}
    elf = Elf(built)
    slot, = elf.got_slots("__cudaLaunchKernel")
    out["as built"] = (built, slot)

    _, vaddr, memsz = elf.relro()
    end = vaddr + memsz
    data = elf.by_name[".data"][3]
    # the emulation needs the slot on the page after RELRO's end, with .data
    if end % PAGE or _page(slot) != end or _page(data) != end:
        pytest.skip("this linker lays the library out otherwise (RELRO end %#x, slot %#x, "
                    ".data %#x)" % (end, slot, data))
    new_end = slot + 8                                   # mid-page, past the slot
    assert new_end % PAGE and new_end <= data + 8
    elf.set_relro_size(new_end - vaddr)
    mid = str(work / "mid-page" / LIBRTUSER)
    os.makedirs(os.path.dirname(mid))
    elf.write(mid)
    out["relro ends mid-page"] = (mid, slot)

    full = str(work / "full" / LIBRTUSER)
    os.makedirs(os.path.dirname(full))
    cmd = [compiler()] + cflags() + ["-shared", "-Wl,-z,relro,-z,now", "-Wl,-soname," + LIBRTUSER,
                                     "-o", full, os.path.join(HERE, "fake_rt_user.c"),
                                     os.path.join(fake_cuda_dir, "libfake_cudart.so"),
                                     os.path.join(fake_cuda_dir, "libcuda.so.1")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    f = Elf(full)
    slot, = f.got_slots("__cudaLaunchKernel")
    _, vaddr, memsz = f.relro()
    assert vaddr <= slot < vaddr + memsz, "-z now puts the slot inside RELRO"
    out["full RELRO"] = (full, slot)
    return out


LOAD = '''
import ctypes, os, sys
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
PATH, SLOT = sys.argv[1], int(sys.argv[2])
PAGE = os.sysconf("SC_PAGESIZE")
# the runtime first, by path: the library's DT_NEEDED is then found by its soname
cudart = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_cudart.so"), ctypes.RTLD_GLOBAL)
rt = ctypes.CDLL(PATH)
rt.fake_rt_launch.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
rt.fake_rt_calls.restype = ctypes.c_long
rt.fake_rt_data.restype = ctypes.c_void_p
class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_size_t), ("l_name", ctypes.c_char_p)]
libc = ctypes.CDLL(None, use_errno=True)
lm = ctypes.POINTER(LinkMap)()
assert libc.dlinfo(ctypes.c_void_p(rt._handle), 2, ctypes.byref(lm)) == 0   # RTLD_DI_LINKMAP
slot = lm.contents.l_addr + SLOT
page = slot - slot % PAGE

def prot(a):
    """The protection of the page holding a, as /proc/self/maps says ("rw-p")."""
    with open("/proc/self/maps") as f:
        for line in f:
            r, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in r.split("-"))
            if lo <= a < hi:
                return perms
    return None
t.empty()
'''


@pytest.mark.parametrize("variant", ["as built", "full RELRO", "relro ends mid-page"])
def test_the_slots_page_keeps_its_protection_and_the_library_its_writes(fake_child, libraries,
                                                                        variant):
    path, slot = libraries[variant]
    c = fake_child(LOAD + '''
out = {"data_page": page == rt.fake_rt_data() - rt.fake_rt_data() % PAGE}
rt.fake_rt_launch(b"k", 0, 1)                   # bound (lazy binding) before the watch
out["before"] = prot(slot)
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 3)
    out["during"] = prot(slot)
    h = _core.stats()["launch_hooks"]
    out["hooks"] = (h["on"], h["entries"], h["routed"])
out["after"] = prot(slot)
rt.fake_rt_launch(b"k", 0, 1)                   # writes its .data (on that page, or not)
with cuda_debug.watch():                        # the entries written again without a walk
    rt.fake_rt_launch(b"k", 0, 2)
out["again"] = prot(slot)
rt.fake_rt_launch(b"k", 0, 1)
out["calls"] = rt.fake_rt_calls()
out["runtime"] = cudart.fake_runtime_calls()
report(out)
''', args=[path, str(slot)])
    r = c.result
    assert r is not None, c                      # a SIGSEGV at the library's data write
    assert r["hooks"][0] == 1 and r["hooks"][1] >= 1 and r["hooks"][2] == 3, r
    if variant == "relro ends mid-page":
        # the emulation holds: the loader left the slot's page writable, .data on it
        assert r["before"].startswith("rw") and r["data_page"], r
    if variant == "full RELRO":
        assert r["before"].startswith("r-"), r
    assert r["during"] == r["before"] and r["after"] == r["before"], r
    assert r["again"] == r["before"], r
    assert r["calls"] == 1 + 5 and r["runtime"] == 3, r


@pytest.mark.parametrize("then", ["unmapped", "mapped again", "loaded again"])
def test_a_library_closed_while_watching_is_not_written_when_the_watch_ends(fake_child, libraries,
                                                                            tmp_path, then):
    """dlclose() inside the watch: leaving it must not write the saved entries
    back. "mapped again": anonymous memory is mapped where its GOT was (what
    the next dlopen or malloc may do there): it must come out untouched.
    "loaded again": the same file opened again (a new copy, where the loader
    puts it): its entries are the loader's, its launches the runtime's, until
    the next watch() takes them."""
    built, slot = libraries["as built"]
    path = str(tmp_path / LIBRTUSER)             # a copy of its own: nothing else holds it
    shutil.copy(built, path)
    c = fake_child(LOAD + '''
import _ctypes
out = {}
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 5)
    h = _core.stats()["launch_hooks"]
    out["hooks"] = (h["on"], h["entries"], h["routed"])
    _ctypes.dlclose(rt._handle)
    with open("/proc/self/maps") as f:
        out["gone"] = PATH not in f.read()
    if sys.argv[3] == "mapped again":
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE
        got = libc.mmap(page, PAGE, 3, 0x02 | 0x20 | 0x100000, -1, 0)
        out["mapped"] = got == page
        ctypes.memset(page, 0xAB, PAGE)
    if sys.argv[3] == "loaded again":
        rt = ctypes.CDLL(PATH)
        rt.fake_rt_launch.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
        r0 = cudart.fake_runtime_calls()
        rt.fake_rt_launch(b"k", 0, 4)                  # loaded after the walk: the runtime's
        out["runtime_in"] = cudart.fake_runtime_calls() - r0
out["after"] = _core.stats()["launch_hooks"]["on"]
if sys.argv[3] == "mapped again":
    out["untouched"] = ctypes.string_at(page, PAGE) == b"\\xab" * PAGE
if sys.argv[3] == "loaded again":
    r0 = cudart.fake_runtime_calls()
    rt.fake_rt_launch(b"k", 0, 3)
    out["runtime_after"] = cudart.fake_runtime_calls() - r0
    with cuda_debug.watch():                           # taken by the next watch's walk
        routed = _core.stats()["launch_hooks"]["routed"]
        rt.fake_rt_launch(b"k", 0, 6)
        out["routed_next"] = _core.stats()["launch_hooks"]["routed"] - routed
report(out)
''', args=[path, str(slot), then])
    r = c.result
    assert r is not None, c                      # SIGSEGV: the watch's exit wrote there
    assert r["hooks"][0] == 1 and r["hooks"][1] >= 1 and r["hooks"][2] == 5, r
    assert r["gone"] is True and r["after"] == 0, r
    if then == "mapped again":
        assert r["mapped"] is True, r
        assert r["untouched"] is True, r
    if then == "loaded again":
        assert r["runtime_in"] == 4 and r["runtime_after"] == 3, r
        assert r["routed_next"] == 6, r
