#!/usr/bin/env python3
"""A runtime-protocol (version 1) sink that lags: it answers `retryable` to
every batch for RETRY_SECONDS (default 60) after it starts, then applies
each batch by counting its records (nothing is kept). For the memory
figures of BENCHMARKS.md: how much a daemon holds while its sink is down.
"""
import json
import os
import sys
import time


def send(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main():
    until = time.monotonic() + float(os.environ.get("RETRY_SECONDS", "60"))
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["type"] == "hello":
            send({"type": "hello", "protocol": 1})
        elif msg["type"] == "apply":
            if time.monotonic() < until:
                send({"type": "result", "outcome": "retryable", "rows": 0})
            else:
                send({"type": "result", "outcome": "applied", "rows": len(msg["records"])})
        else:
            send({"type": "error", "message": f"unexpected {msg['type']}"})


if __name__ == "__main__":
    main()
