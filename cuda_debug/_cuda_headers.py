"""Where the CUDA headers are: the one search, for the generators
(tools/gen/: _gen_common.py loads this file by path),
the fake driver of the test suite and the tests that compare with the real
headers. The build itself needs none (csrc/base/cuda_api.h). Standard library
only, and no import of the package.

Looked at, in order (the first folder set that holds every wanted header wins):
``$CUDA_HOME`` and ``$CUDA_PATH`` (``include``, ``extras/CUPTI/include``,
``targets/*/include``), ``/usr/local/cuda``, then NVIDIA's pip wheels in every
site-packages (``nvidia/cu13/include``; the CUDA 12 layout
``nvidia/{cuda_runtime,cuda_cupti,cublas,cuda_nvcc}/include``).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import glob
import os
import site
import sysconfig

HEADERS = ("cuda.h", "cupti.h")


def site_dirs():
    dirs = [sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")]
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:          # virtualenv's old site.py
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def candidates():
    """Folder sets to try, in order (each a list of folders)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out = []
    for root in filter(None, roots):
        out.append([os.path.join(root, "include"), os.path.join(root, "extras", "CUPTI", "include")])
        out.append(sorted(glob.glob(os.path.join(root, "targets", "*", "include"))))
    for sp in site_dirs():
        nv = os.path.join(sp, "nvidia")
        out.append([os.path.join(nv, "cu13", "include")])
        out.append([os.path.join(nv, p, "include")
                    for p in ("cuda_runtime", "cuda_cupti", "cublas", "cuda_nvcc")])
    return out


def find(headers=HEADERS):
    """(folders, tried): the first folder set holding every header in
    `headers`, or None; and every folder looked at, in order."""
    tried = []
    for dirs in candidates():
        tried.extend(d for d in dirs if d not in tried)
        dirs = [d for d in dirs if os.path.isdir(d)]
        if dirs and all(any(os.path.exists(os.path.join(d, h)) for d in dirs) for h in headers):
            return dirs, tried
    return None, tried


def header(name, dirs=None):
    """The path of one header in `dirs` (default: find()), or None."""
    if dirs is None:
        dirs, _ = find((name,))
    for d in dirs or ():
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return None
