#!/usr/bin/env python3
"""A runtime-protocol (version 1) schema plugin for the end-to-end tests.

Accepts every schema unless it has "reject": true. Appends each question it
gets to ASK_LOG, one line each: stream and fingerprint.
"""
import json
import os
import sys


def send(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main():
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["type"] == "hello":
            send({"type": "hello", "protocol": 1})
        elif msg["type"] == "schema":
            with open(os.environ["ASK_LOG"], "a") as log:
                log.write(f"{msg['stream']} {msg['fingerprint']}\n")
            schema = msg["schema"]
            if isinstance(schema, dict) and schema.get("reject"):
                send({"type": "decision", "accept": False, "reason": "this schema is refused on purpose"})
            else:
                send({"type": "decision", "accept": True})
        else:
            send({"type": "error", "message": f"unknown request {msg['type']}"})


if __name__ == "__main__":
    main()
