#!/usr/bin/env python3
"""A runtime-protocol (version 1) sink that misbehaves at random, for the
fuzz tests: each process draws its behaviour from FUZZ_SEED and how many
processes ran before it (counted in the file FUZZ_STARTS), so a seed replays
the same choices. Per request it answers correctly, or twice, or with a
stale answer (the previous request's result), or with garbage, or with a
line past the host's bound, or a line nobody asked for before the answer,
or answers retryable without applying, or applies and exits without
answering, or hangs. Batches it applies go to
OUT_DIR/<stream>/<seq, 20 digits>-<compaction_id>.jsonl like sink.py's (a
replay with the same records is already_applied; anything else under a
taken number is fatal): the same code writes them.
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sink import apply, send  # noqa: E402  (sink.py's batch files and lines)

STARTS = os.environ["FUZZ_STARTS"]


def main():
    with open(STARTS, "a+") as f:
        f.seek(0)
        n = len(f.read().splitlines())
        f.write(f"{os.getpid()}\n")
    rng = random.Random(int(os.environ["FUZZ_SEED"]) * 1000 + n)
    last = None
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["type"] == "hello":
            send({"type": "hello", "protocol": 1})
            continue
        if msg["type"] != "apply":
            send({"type": "error", "message": "unknown request"})
            continue
        roll = rng.random()
        if roll < 0.04:
            send({"type": "result", "outcome": "retryable", "seq": msg["seq"], "compaction_id": msg["compaction_id"]})
            continue
        if roll < 0.07:
            apply(msg)
            os._exit(0)
        if roll < 0.08:
            time.sleep(3600)
        if roll < 0.11:
            sys.stdout.write(rng.choice(["garbage\n", "{}\n", '{"type":"result"}\n', "\n", "[1,2\n"]))
            sys.stdout.flush()
            continue
        if roll < 0.12:
            sys.stdout.write("x" * (1 << 20) + "xx\n")
            sys.stdout.flush()
            continue
        if roll < 0.15 and last is not None:
            send(last)
            continue
        if roll < 0.17:
            send({"type": "result", "outcome": "applied", "seq": msg["seq"] + 1, "compaction_id": "0"})
        result = {"type": "result", "outcome": apply(msg), "rows": len(msg["records"]),
                  "seq": msg["seq"], "compaction_id": msg["compaction_id"]}
        send(result)
        if roll < 0.25:
            send(result)
        last = result


if __name__ == "__main__":
    main()
