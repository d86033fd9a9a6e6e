"""Code that children of more than one test module start with."""

#: Loads the fake runtime and a library that launches through it the way nvcc's
#: stubs do (tests/fake_cuda/fake_cudart.c, fake_rt_user.c): ``rt.fake_rt_launch``.
RT = '''
import ctypes, os
rt = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_rt_user.so"))
rt.fake_rt_launch.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
cudart = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_cudart.so"))
cudart.fake_runtime_calls.restype = ctypes.c_long
'''

#: A torchrun-agent-like parent of two ranks: ``AGENT % rank_script_path``.
AGENT = '''
import os, subprocess, sys, time
procs = [subprocess.Popen([sys.executable, %r],
                          env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2"))
         for r in range(2)]
for p in procs:
    p.wait()
'''
