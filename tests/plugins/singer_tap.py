#!/usr/bin/env python3
"""A Singer tap for the end-to-end tests that resumes faithfully: it sends
exactly the records after its state's bookmark, in the same order.

Streams STREAMS (comma-separated), RECORDS records each: {"stream",
"partition": 0, "seq"}, the streams interleaved record by record. After every
EVERY records of each stream it sends STATE {"bookmarks": {stream: {"seq":
next}}}; at the end, a last STATE. `--discover` prints a catalog whose streams
have key_properties ["partition", "seq"]. RATE caps records a second over all
streams (a slow upstream, so that a chaos kill lands mid-sync on any
machine). MISBEHAVE=garbage|exit|hang misbehaves once, after MISBEHAVE_AT
records of a run, remembering in the file MARKER that it did. SCHEMA (a JSON
object) is the schema its SCHEMA messages carry. PAD adds a field of PAD
bytes to every record.
"""
import json
import os
import sys
import time

STREAMS = os.environ.get("STREAMS", "events").split(",")
RECORDS = int(os.environ.get("RECORDS", "1000"))
EVERY = int(os.environ.get("EVERY", "100"))
RATE = float(os.environ.get("RATE", "0"))
MISBEHAVE = os.environ.get("MISBEHAVE")
MISBEHAVE_AT = int(os.environ.get("MISBEHAVE_AT", "50"))
MARKER = os.environ.get("MARKER")
SCHEMA = json.loads(os.environ.get("SCHEMA", '{"type": "object"}'))
PAD = "x" * int(os.environ.get("PAD", "0"))


def arg(name):
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return None


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")


if "--discover" in sys.argv:
    streams = [{"tap_stream_id": s, "stream": s, "key_properties": ["partition", "seq"],
                "schema": {"type": "object"}} for s in STREAMS]
    print(json.dumps({"streams": streams}))
    sys.exit(0)

state = {"bookmarks": {}}
if arg("--state"):
    with open(arg("--state")) as f:
        state = json.load(f)
print(f"tap: starting from {json.dumps(state)}", file=sys.stderr)
next_seq = {s: state["bookmarks"].get(s, {}).get("seq", 0) for s in STREAMS}
for s in STREAMS:
    send({"type": "SCHEMA", "stream": s, "schema": SCHEMA, "key_properties": ["partition", "seq"]})
sent = 0
started = time.monotonic()
while any(n < RECORDS for n in next_seq.values()):
    for s in STREAMS:
        n = next_seq[s]
        if n >= RECORDS:
            continue
        if MISBEHAVE and sent == MISBEHAVE_AT and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            sys.stdout.flush()
            if MISBEHAVE == "garbage":
                print("Traceback (most recent call last): not a Singer message")
                sys.stdout.flush()
                time.sleep(60)
            elif MISBEHAVE == "exit":
                sys.exit(3)
            else:
                time.sleep(3600)
        record = {"stream": s, "partition": 0, "seq": n}
        if PAD:
            record["pad"] = PAD
        send({"type": "RECORD", "stream": s, "record": record})
        next_seq[s] = n + 1
        sent += 1
        if next_seq[s] % EVERY == 0:
            state["bookmarks"][s] = {"seq": next_seq[s]}
            send({"type": "STATE", "value": state})
        if RATE and sent % 100 == 0:
            sys.stdout.flush()
            ahead = sent / RATE - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
for s in STREAMS:
    state["bookmarks"][s] = {"seq": next_seq[s]}
send({"type": "STATE", "value": state})
sys.stdout.flush()
