"""A client of PyTorch's c10d TCPStore (the store torchrun runs at
MASTER_ADDR:MASTER_PORT), for ``cuda-debug dump --job`` (cuda_debug/_dump_job.py).

Only what dump needs: set, get (of a key known to exist), add, check, delete. Written
here rather than taken from ``torch.distributed.TCPStore`` so that a rank can
publish and ``dump --job`` can read with or without PyTorch importable in that
process. The wire format is the store's (torch/csrc/distributed/c10d/
TCPStore.cpp, store/TCPStoreBackend.hpp): after connecting, VALIDATE with the
magic number; each request is a one-byte QueryType then its arguments, a
string as a uint64 length and its bytes, numbers in the machine's byte order;
ADD answers an int64, CHECK one byte (0 ready), GET a uint64 length and bytes,
DELETE_KEY an int64 (how many keys it deleted).
Keys get the prefix torch's own client puts before each ("/"), so that
``TCPStore.get("cuda_debug/...")`` reads what this client set, and back.
tests/hangs_dump_jobs/test_dump.py checks it against torch's own server.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import socket
import struct
from typing import List

MAGIC = 0x3C85F7CE
VALIDATE, SET, GET, ADD, CHECK, DELETE_KEY = 0, 1, 3, 4, 5, 8
READY = 0


class StoreError(OSError):
    pass


class TooLarge(ValueError):
    """A value longer than the caller reads (it was read and dropped)."""


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
        # A bytearray grows in place (amortised): a value of n bytes costs O(n),
        # not the O(n^2 / chunk) of concatenating bytes (a 32 MiB document in
        # 4 KiB reads took 13 s). It grows with what arrives, not with what a
        # length prefix promises.
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                raise StoreError("the store closed the connection")
            out += chunk
        return bytes(out)

    def set(self, key: str, value) -> None:
        self.sock.sendall(bytes([SET]) + self._k(key) + self._s(value))

    def add(self, key: str, delta: int) -> int:
        self.sock.sendall(bytes([ADD]) + self._k(key) + struct.pack("=q", delta))
        return struct.unpack("=q", self._recv(8))[0]

    def check(self, keys: List[str]) -> bool:
        self.sock.sendall(bytes([CHECK]) + struct.pack("=Q", len(keys)) +
                          b"".join(self._k(k) for k in keys))
        return self._recv(1)[0] == READY

    def delete(self, key: str) -> bool:
        """Remove a key (one that is not there: False)."""
        self.sock.sendall(bytes([DELETE_KEY]) + self._k(key))
        return struct.unpack("=q", self._recv(8))[0] > 0

    def get(self, key: str, most: int = 256 << 20) -> bytes:
        """The value of a key that exists (check() first: GET of a missing
        key is an error for the store). One longer than `most` bytes is read
        and dropped (the connection stays usable), then TooLarge; one longer
        than 256 MiB is StoreError (the connection is then of no more use)."""
        self.sock.sendall(bytes([GET]) + self._k(key))
        n = struct.unpack("=Q", self._recv(8))[0]
        if n > 256 << 20:
            raise StoreError("a value of %d bytes under %s: not cuda_debug's" % (n, key))
        if n > most:
            while n > 0:
                n -= len(self._recv(min(n, 1 << 20)))
            raise TooLarge("the value under %s is longer than %d bytes: not cuda_debug's"
                           % (key, most))
        return self._recv(n)
