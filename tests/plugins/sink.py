#!/usr/bin/env python3
"""A runtime-protocol (version 1) sink for the end-to-end tests.

With REFUSE=retryable (or fatal) it answers that to every batch; with
LAG_SECONDS=S it answers retryable for S seconds after it starts, then
applies (a sink that is down for a while). Without OUT_DIR it keeps
nothing: each batch is applied by counting it (BENCHMARKS.md's lagging sink).
Writes each batch to OUT_DIR/<stream>/<seq, 20 digits>-<compaction_id>.jsonl
(temporary file, fsync, rename), one record per line as received. A replay of
the same id with the same records is already_applied; anything else under a
number already used is fatal.
"""
import json
import os
import sys
import time

OUT_DIR = os.environ.get("OUT_DIR")


def send(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def apply(msg):
    if OUT_DIR is None:
        return "applied"
    stream_dir = os.path.join(OUT_DIR, msg["stream"])
    os.makedirs(stream_dir, exist_ok=True)
    seq = msg["seq"]
    name = f"{seq:020}-{msg['compaction_id']}.jsonl"
    body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in msg["records"])
    path = os.path.join(stream_dir, name)
    if os.path.exists(path):
        with open(path) as f:
            return "already_applied" if f.read() == body else "fatal"
    if any(n.startswith(f"{seq:020}-") for n in os.listdir(stream_dir)):
        return "fatal"
    tmp = os.path.join(stream_dir, "." + name)
    with open(tmp, "w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    return "applied"


def main():
    lag_until = time.monotonic() + float(os.environ.get("LAG_SECONDS", "0"))
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["type"] == "hello":
            send({"type": "hello", "protocol": 1})
        elif msg["type"] == "apply":
            refuse = os.environ.get("REFUSE") or (time.monotonic() < lag_until and "retryable")
            outcome = refuse if refuse else apply(msg)
            send({"type": "result", "outcome": outcome, "rows": len(msg["records"])})
        else:
            send({"type": "error", "message": f"unknown request {msg['type']}"})


if __name__ == "__main__":
    main()
