"""A name server that never answers, for the tests of webhook host resolution: a real UDP server
on loopback, and the blocking DNS lookup that asks it."""

from __future__ import annotations

import socket
import struct
import threading


class BlackHoledNameServer:
    """A UDP name server on loopback that reads queries and answers none until closed; closing it
    sends each asker an empty datagram, so the threads blocked on it end."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.askers: list[tuple[str, int]] = []
        self.asked = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                _, asker = self.sock.recvfrom(512)
            except OSError:
                return
            with self.asked:
                self.askers.append(asker)
                self.asked.notify_all()

    def wait_for_queries(self, count: int) -> None:
        with self.asked:
            assert self.asked.wait_for(lambda: len(self.askers) >= count, timeout=30)

    def lookup(self, host: str, port: int) -> list[str]:
        """A blocking DNS A query for `host` sent to this server (what a resolver does)."""
        question = b"".join(bytes([len(p)]) + p.encode() for p in host.split(".")) + b"\0"
        query = struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", 1, 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(60)
            sock.sendto(query, self.address)
            sock.recv(512)
        return []

    def close(self) -> None:
        with self.asked:
            for asker in self.askers:
                self.sock.sendto(b"", asker)
        self.sock.close()
