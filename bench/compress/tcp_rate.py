#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# File: bench/compress/tcp_rate.py
# Raw TCP throughput between two network namespaces (bench/peers/tcp_bw.c forks its peer, so
# both ends stay in one namespace): the limit the shaped link sets, measured the way the
# collectives use it.
#   tcp_rate.py serve ADDRESS PORT          one connection per test, until "stop"
#   tcp_rate.py run ADDRESS PORT BYTES      one_way: this end sends BYTES, time until the
#                                           server has them all (it answers one byte);
#                                           both_ways: each end sends BYTES while receiving
#                                           BYTES; rates per direction, GB/s (1e9 B/s)
# The client prints "one_way GBPS" and "both_ways GBPS" lines.
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 20


def send_n(sock, n):
    buf = bytes(CHUNK)
    view = memoryview(buf)
    while n > 0:
        k = min(n, CHUNK)
        sock.sendall(view[:k])
        n -= k


def recv_n(sock, n):
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while n > 0:
        k = sock.recv_into(view[: min(n, CHUNK)])
        if k == 0:
            raise ConnectionError("peer closed early")
        n -= k


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        part = sock.recv(n - len(out))
        if not part:
            raise ConnectionError("peer closed early")
        out += part
    return out


def serve(address, port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((address, port))
    ls.listen(1)
    print("ready", flush=True)
    while True:
        conn, _ = ls.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            mode, n = struct.unpack("!IQ", recv_exact(conn, 12))
            if mode == 0:
                return
            sender = None
            if mode == 2:
                sender = threading.Thread(target=send_n, args=(conn, n))
                sender.start()
            recv_n(conn, n)
            if sender is not None:
                sender.join()
            conn.sendall(b"k")


def connect(address, port):
    for _ in range(100):
        try:
            s = socket.create_connection((address, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            time.sleep(0.05)
    raise ConnectionError(f"cannot connect to {address}:{port}")


def run(address, port, n):
    for mode, name in ((1, "one_way"), (2, "both_ways")):
        with connect(address, port) as s:
            s.sendall(struct.pack("!IQ", mode, n))
            start = time.monotonic()
            receiver = None
            if mode == 2:
                receiver = threading.Thread(target=recv_n, args=(s, n))
                receiver.start()
            send_n(s, n)
            if receiver is not None:
                receiver.join()
            recv_exact(s, 1)
            seconds = time.monotonic() - start
        print(f"{name} {n / seconds / 1e9:.4f}", flush=True)
    with connect(address, port) as s:
        s.sendall(struct.pack("!IQ", 0, 0))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: tcp_rate.py serve ADDRESS PORT | run ADDRESS PORT BYTES")


if __name__ == "__main__":
    main()
