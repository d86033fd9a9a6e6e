"""``python -m cuda_debug ...`` as a subprocess, importing the cuda_debug under test."""
import os
import subprocess
import sys

from conftest import PKG_PARENT, gpu_unavailable_reason

NO_GPU = gpu_unavailable_reason() is not None


def cli_env(env=None):
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))
    full_env.pop("CUDA_LAUNCH_BLOCKING", None)
    full_env.update(env or {})
    return full_env


def cli(*args, cwd=None, env=None, timeout=120, input=None, command=None):
    """``python -m cuda_debug args...`` (or `command` + args) in a subprocess."""
    return subprocess.run((command or [sys.executable, "-m", "cuda_debug"]) + list(args),
                          cwd=cwd, env=cli_env(env), capture_output=True, text=True,
                          timeout=timeout, input=input if input is not None else "")
