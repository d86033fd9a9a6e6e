"""A stand-in for PyTorch's c10d TCPStore server (what torchrun runs at
MASTER_ADDR:MASTER_PORT), for the tests of ``dump --job`` without PyTorch:
the subset of the wire format cuda_debug/_dump_tcpstore.py speaks (VALIDATE, SET,
GET, ADD, CHECK, DELETE_KEY; keys and values as a uint64 length and bytes, numbers in the
machine's byte order). The torch-based tests in tests/hangs_dump_jobs/test_dump.py check
the client against torch's own server; this one lets a test plant anything in
the store, as anyone who can reach the port can.

    with FakeStore() as store:          # 127.0.0.1, a free port
        store.put("cuda_debug/dump/rank/0", b"[1, 2]")
        store.port, store.value("cuda_debug/dump/requests")
"""
import socket
import socketserver
import struct
import threading

VALIDATE, SET, GET, ADD, CHECK, DELETE_KEY = 0, 1, 3, 4, 5, 8


class _Handler(socketserver.BaseRequestHandler):
    def _read(self, n):
        out = bytearray()
        while len(out) < n:
            b = self.request.recv(n - len(out))
            if not b:
                raise EOFError
            out += b
        return bytes(out)

    def _string(self):
        return self._read(struct.unpack("=Q", self._read(8))[0])

    def handle(self):
        store = self.server.store
        with store.lock:
            store.conns.add(self.request)
        try:
            while True:
                op = self._read(1)[0]
                if op == VALIDATE:
                    self._read(4)
                elif op == SET:
                    key, value = self._string(), self._string()
                    with store.lock:
                        store.data[key] = value
                        if store.on_set:          # before this client's next request
                            store.on_set(key, value)
                elif op == GET:
                    key = self._string()
                    with store.lock:
                        value = store.data.get(key)
                    if value is None:          # torch's server: an error; here: the end
                        return
                    self.request.sendall(struct.pack("=Q", len(value)) + value)
                elif op == ADD:
                    key, delta = self._string(), struct.unpack("=q", self._read(8))[0]
                    with store.lock:
                        v = int(store.data.get(key, b"0")) + delta
                        store.data[key] = str(v).encode()
                    self.request.sendall(struct.pack("=q", v))
                elif op == DELETE_KEY:
                    key = self._string()
                    with store.lock:
                        gone = store.data.pop(key, None) is not None
                    self.request.sendall(struct.pack("=q", int(gone)))
                elif op == CHECK:
                    n = struct.unpack("=Q", self._read(8))[0]
                    keys = [self._string() for _ in range(n)]
                    with store.lock:
                        ready = all(k in store.data for k in keys)
                    self.request.sendall(bytes([0 if ready else 1]))
                else:
                    return
        except (EOFError, OSError, ValueError):
            return
        finally:
            with store.lock:
                store.conns.discard(self.request)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeStore:
    def __init__(self):
        self.data = {}
        self.lock = threading.Lock()
        # on_set(key, value): called under the lock as a SET lands, before the
        # server reads that client's next request (what another client does
        # at that moment); write self.data directly there.
        self.on_set = None
        self.conns = set()                 # the clients' connections, open now
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.store = self
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def put(self, key, value):
        """What a client's set(key, value) stores (key without torch's "/")."""
        with self.lock:
            self.data[b"/" + key.encode()] = value if isinstance(value, bytes) else value.encode()

    def drop_connections(self):
        """A hiccup: every client's connection closed by the store."""
        import socket as _socket
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass

    def keys(self, prefix=""):
        """The keys (without torch's "/") that start with `prefix`."""
        with self.lock:
            return sorted(k[1:].decode() for k in self.data if k[1:].startswith(prefix.encode()))

    def value(self, key):
        with self.lock:
            return self.data.get(b"/" + key.encode())

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
