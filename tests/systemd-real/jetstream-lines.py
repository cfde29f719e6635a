#!/usr/bin/env python3
"""tests/systemd-real/jetstream-lines.py -- what a JetStream stream holds on
one subject, compared with the bytes logmon wrote into the files.

    jetstream-lines.py URL STREAM SUBJECT EXPECTED_FILE TIMEOUT_SECONDS

Reads the stream's messages one by one through the JetStream API
($JS.API.STREAM.MSG.GET, a plain NATS request: no client library needed)
and concatenates the payloads on SUBJECT, until they equal EXPECTED_FILE's
bytes (exit 0) or TIMEOUT_SECONDS pass. Exit 1 when they differ (the first
differing line is printed) or fall short in time. Run by run.sh inside the
throwaway systemd, against a nats-server on loopback.
"""
import base64
import json
import socket
import sys
import time


class Nats:
    """Just enough of the NATS protocol for request/reply."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.buf = b""
        self._line()  # INFO
        self.sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false,"headers":true,'
            b'"no_responders":true,"protocol":1}\r\nSUB _INBOX.ci 1\r\nPING\r\n'
        )
        while self._line() != b"PONG":
            pass

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("nats-server closed the connection")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        if line == b"PING":
            self.sock.sendall(b"PONG\r\n")
        if line.startswith(b"-ERR"):
            raise ConnectionError(line.decode(errors="replace"))
        return line

    def _take(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def request(self, subject, payload):
        """The reply's payload (headers dropped), as JSON."""
        self.sock.sendall(b"PUB %s _INBOX.ci %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
        while True:
            line = self._line()
            if line.startswith(b"MSG "):
                body = self._take(int(line.split()[-1]))
            elif line.startswith(b"HMSG "):
                parts = line.split()
                msg = self._take(int(parts[-1]))
                body = msg[int(parts[-2]) :]
            else:
                continue
            return json.loads(body) if body else {}


def first_difference(got, want):
    g, w = got.split(b"\n"), want.split(b"\n")
    for i, (a, b) in enumerate(zip(g, w)):
        if a != b:
            return "line %d: got %r, want %r" % (i + 1, a[:80], b[:80])
    return "got %d lines, want %d" % (len(g) - 1, len(w) - 1)


def main():
    url, stream, subject, expected_file, timeout = sys.argv[1:6]
    host, port = url.split("://", 1)[-1].rsplit(":", 1)
    with open(expected_file, "rb") as f:
        want = f.read()
    nats = Nats(host, int(port))
    got, seq, messages = b"", 1, 0
    deadline = time.monotonic() + float(timeout)
    while True:
        info = nats.request("$JS.API.STREAM.INFO." + stream, b"")
        last = info.get("state", {}).get("last_seq", 0)
        while seq <= last:
            r = nats.request("$JS.API.STREAM.MSG.GET." + stream, json.dumps({"seq": seq}).encode())
            m = r.get("message")
            if m is None:
                print("no message %d in %s: %s" % (seq, stream, r.get("error")))
                return 1
            if m["subject"] == subject:
                got += base64.b64decode(m.get("data", ""))
                messages += 1
            seq += 1
        if got == want:
            print("%d bytes, %d lines in %d messages on %s" % (len(got), got.count(b"\n"), messages, subject))
            return 0
        if not want.startswith(got):
            print("%s holds other bytes than the files: %s" % (subject, first_difference(got, want)))
            return 1
        if time.monotonic() > deadline:
            print("after %ss %s holds %d of the %d bytes" % (timeout, subject, len(got), len(want)))
            return 1
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
