#!/usr/bin/env python3
"""What idle HTTP/1.1 keep-alive connections cost a running server, in RSS. Run by hand.

    scripts/idle-connections-rss.py PORT COUNT PID [PATH]

Opens COUNT connections to 127.0.0.1:PORT, sends one `GET PATH` (default /healthz) on
each and reads the answer, keeps them all open, and prints the RSS of process PID
before, with the connections held, and after closing them. Raise the open-file limit
first (ulimit -n) for large counts. The "about 21 KiB per held connection" in
docs/benchmarks.md came from a `gantry server` of the shipped build with COUNT 10000.
"""
import socket
import sys
import time


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"no process {pid}")


def main():
    port, count, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    path = sys.argv[4] if len(sys.argv) > 4 else "/healthz"
    before = rss_mib(pid)
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sockets.append(s)
    for s in sockets:
        s.settimeout(5)
        s.recv(65536)
    time.sleep(2)
    held = rss_mib(pid)
    for s in sockets:
        s.close()
    time.sleep(2)
    after = rss_mib(pid)
    print(f"RSS before {before:.1f} MiB, with {count} idle connections {held:.1f} MiB "
          f"({(held - before) * 1024 / count:.1f} KiB each), after closing {after:.1f} MiB")


if __name__ == "__main__":
    main()
