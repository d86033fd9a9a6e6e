"""A client of PyTorch's c10d TCPStore (the store torchrun runs at
MASTER_ADDR:MASTER_PORT), for ``cuda-debug dump --job`` (cuda_debug/_job.py).

Only what dump needs: set, get (of a key known to exist), add, check. Written
here rather than taken from ``torch.distributed.TCPStore`` so that a rank can
publish and ``dump --job`` can read with or without PyTorch importable in that
process. The wire format is the store's (torch/csrc/distributed/c10d/
TCPStore.cpp, store/TCPStoreBackend.hpp): after connecting, VALIDATE with the
magic number; each request is a one-byte QueryType then its arguments, a
string as a uint64 length and its bytes, numbers in the machine's byte order;
ADD answers an int64, CHECK one byte (0 ready), GET a uint64 length and bytes.
Keys get the prefix torch's own client puts before each ("/"), so that
``TCPStore.get("cuda_debug/...")`` reads what this client set, and back.
tests/test_dump_cpu.py checks it against torch's own server.
"""
import socket
import struct
from typing import List

MAGIC = 0x3C85F7CE
VALIDATE, SET, GET, ADD, CHECK = 0, 1, 3, 4, 5
READY = 0


class StoreError(OSError):
    pass


class Client:
    def __init__(self, host: str, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(struct.pack("=BI", VALIDATE, MAGIC))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _k(key: str) -> bytes:
        return Client._s("/" + key)

    @staticmethod
    def _s(b) -> bytes:
        b = b.encode() if isinstance(b, str) else bytes(b)
        return struct.pack("=Q", len(b)) + b

    def _recv(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise StoreError("the store closed the connection")
            out += chunk
        return out

    def set(self, key: str, value) -> None:
        self.sock.sendall(bytes([SET]) + self._k(key) + self._s(value))

    def add(self, key: str, delta: int) -> int:
        self.sock.sendall(bytes([ADD]) + self._k(key) + struct.pack("=q", delta))
        return struct.unpack("=q", self._recv(8))[0]

    def check(self, keys: List[str]) -> bool:
        self.sock.sendall(bytes([CHECK]) + struct.pack("=Q", len(keys)) +
                          b"".join(self._k(k) for k in keys))
        return self._recv(1)[0] == READY

    def get(self, key: str) -> bytes:
        """The value of a key that exists (check() first: GET of a missing
        key is an error for the store)."""
        self.sock.sendall(bytes([GET]) + self._k(key))
        n = struct.unpack("=Q", self._recv(8))[0]
        if n > 256 << 20:
            raise StoreError("a value of %d bytes: not a cuda_debug document" % n)
        return self._recv(n)
