#!/usr/bin/env python3
"""A runtime-protocol (version 1) source for the end-to-end tests.

PARTITIONS partitions of stream STREAM, RECORDS records each (0: endless).
With BAD_EVERY=N every record of a partition also has "amount": its seq,
except every N-th, which has "bad": true and "amount": "n/a" (not a number).
Each record is {"stream","partition","seq","note"} at position seq.
RAW_DATA=1 writes each record's data with unusual spacing and key order, to
show the host keeps the exact bytes. SCHEMA, when set, is sent as the stream's schema (a JSON value) with every
batch. OPEN_ERROR_MARKER, when set and the file is absent, makes the first open of
a restarted process (one started after MARKER exists) answer an error, once.
A read that comes before any successful open starts each partition at
UNOPENED_START (default 0), like a source that falls back to "latest".
MISBEHAVE=garbage|exit|hang misbehaves once, on read number MISBEHAVE_AT,
remembering in the file MARKER that it did. PIDFILE receives its pid.
RATE, when set, caps what it sends at RATE records a second (a slow upstream),
so that a run cannot finish before a chaos kill however fast the machine is.
STARTS, when set, is a file each process appends its pid to. CHILD=1 starts a
child process of its own that sleeps (its command line carries this
process's arguments, so a test can count both). HANG_READS=1 hangs on every
read. LONG_LINE=N answers the first read with N bytes and no newline, then
hangs. STDERR_TEXT is written to stderr at start. UNDECLARED_STREAM, when set,
is the stream every batch names instead of the declared STREAM.
ACK_LOG, when set, is a file each acknowledgement is appended to
("partition position" lines, with O_DSYNC) before it is answered; a source started again
never sends below what it was acknowledged there, as a source that released
acknowledged data (a Kafka offset committed, a file deleted) could not.
"""
import json
import os
import subprocess
import sys
import time

PARTITIONS = int(os.environ.get("PARTITIONS", "2"))
RECORDS = int(os.environ.get("RECORDS", "1000"))
STREAM = os.environ.get("STREAM", "orders")
MISBEHAVE = os.environ.get("MISBEHAVE")
MISBEHAVE_AT = int(os.environ.get("MISBEHAVE_AT", "3"))
MARKER = os.environ.get("MARKER")
SCHEMA = json.loads(os.environ["SCHEMA"]) if os.environ.get("SCHEMA") else None
RATE = float(os.environ.get("RATE", "0"))
# Every BAD_EVERY-th record of a partition carries "bad": true (a sink
# run with REFUSE_FIELD=bad refuses it).
BAD_EVERY = int(os.environ.get("BAD_EVERY", "0"))


def send(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def raw_data(d):
    return '{ "seq":%d,  "partition" :%d,"stream":"%s", "note":"x" }' % (d["seq"], d["partition"], d["stream"])


def send_raw(batches, exhausted):
    parts = []
    for b in batches:
        records = ",".join('{"position":%d,"data":%s}' % (r["position"], raw_data(r["data"])) for r in b["records"])
        rest = {k: v for k, v in b.items() if k != "records"}
        parts.append(json.dumps(rest, separators=(",", ":"))[:-1] + ',"records":[' + records + "]}")
    sys.stdout.write('{"type":"batch","batches":[' + ",".join(parts) + '],"exhausted":' + json.dumps(exhausted) + "}\n")
    sys.stdout.flush()


def misbehave_now(reads):
    if not MISBEHAVE or reads != MISBEHAVE_AT or (MARKER and os.path.exists(MARKER)):
        return
    if MARKER:
        open(MARKER, "w").close()
    print(f"source: misbehaving on purpose: {MISBEHAVE}", file=sys.stderr, flush=True)
    if MISBEHAVE == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
    elif MISBEHAVE == "exit":
        sys.exit(3)
    elif MISBEHAVE == "hang":
        time.sleep(3600)


def acked_positions():
    """The highest position each partition was acknowledged (ACK_LOG)."""
    acked = {}
    if os.environ.get("ACK_LOG") and os.path.exists(os.environ["ACK_LOG"]):
        with open(os.environ["ACK_LOG"]) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    p, pos = int(parts[0]), int(parts[1])
                    acked[p] = max(acked.get(p, 0), pos)
    return acked


def main():
    if os.environ.get("PIDFILE"):
        with open(os.environ["PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    if os.environ.get("STARTS"):
        with open(os.environ["STARTS"], "a") as f:
            f.write(f"{os.getpid()}\n")
    if os.environ.get("CHILD"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"] + sys.argv[1:])
    if os.environ.get("STDERR_TEXT"):
        print(os.environ["STDERR_TEXT"], file=sys.stderr, flush=True)
    unopened = int(os.environ.get("UNOPENED_START", "0"))
    next_pos = {p: unopened for p in range(PARTITIONS)}
    restarted = bool(MARKER and os.path.exists(MARKER))
    reads = 0
    started = time.monotonic()
    sent = 0
    for line in sys.stdin:
        msg = json.loads(line)
        kind = msg["type"]
        if kind == "hello":
            send({"type": "hello", "protocol": 1, "streams": [STREAM]})
        elif kind == "open":
            flag = os.environ.get("OPEN_ERROR_MARKER")
            if restarted and flag and not os.path.exists(flag):
                open(flag, "w").close()
                send({"type": "error", "message": "upstream not reachable yet"})
                continue
            next_pos = {p: 0 for p in range(PARTITIONS)}
            for r in msg["resume"]:
                next_pos[r["partition"]] = r["position"]
            for p, acked in acked_positions().items():
                if next_pos.get(p, 0) < acked:
                    print(f"source: partition {p} resumes at {next_pos.get(p, 0)}, below the {acked} it was "
                          "acknowledged: that input is released and never comes again", file=sys.stderr, flush=True)
                    next_pos[p] = acked
            send({"type": "opened"})
        elif kind == "read":
            reads += 1
            misbehave_now(reads)
            if os.environ.get("HANG_READS"):
                time.sleep(3600)
            if os.environ.get("LONG_LINE"):
                n = int(os.environ["LONG_LINE"])
                chunk = "x" * (1 << 20)
                while n > 0:
                    sys.stdout.write(chunk[: min(n, len(chunk))])
                    n -= len(chunk)
                sys.stdout.flush()
                time.sleep(3600)
            budget = msg["max"]
            batches = []
            for p in range(PARTITIONS):
                start = next_pos[p]
                end = start + min(budget, 200)
                if RECORDS:
                    end = min(end, RECORDS)
                if end <= start:
                    continue
                records = [
                    {"position": s, "data": {"stream": STREAM, "partition": p, "seq": s, "note": "x"}}
                    for s in range(start, end)
                ]
                if BAD_EVERY:
                    for r in records:
                        if r["position"] % BAD_EVERY == BAD_EVERY - 1:
                            r["data"]["bad"] = True
                            r["data"]["amount"] = "n/a"
                        else:
                            r["data"]["amount"] = r["position"]
                stream = os.environ.get("UNDECLARED_STREAM", STREAM)
                batch = {"partition": p, "stream": stream, "records": records, "end": end, "checkpoint": f"cp-{p}-{end}"}
                if SCHEMA is not None:
                    batch["schema"] = SCHEMA
                batches.append(batch)
                next_pos[p] = end
                budget -= end - start
                if budget == 0:
                    break
            sent += sum(len(b["records"]) for b in batches)
            if RATE:
                time.sleep(max(0.0, started + sent / RATE - time.monotonic()))
            exhausted = RECORDS > 0 and all(next_pos[p] >= RECORDS for p in range(PARTITIONS))
            if os.environ.get("RAW_DATA"):
                send_raw(batches, exhausted)
            else:
                send({"type": "batch", "batches": batches, "exhausted": exhausted})
        elif kind == "ack":
            if os.environ.get("ACK_LOG"):
                # Durable before it is answered (O_DSYNC), as a source that
                # released what it was acknowledged would make its release.
                fd = os.open(os.environ["ACK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_DSYNC, 0o600)
                try:
                    os.write(fd, "".join(f"{a['partition']} {a['position']}\n" for a in msg["acks"]).encode())
                finally:
                    os.close(fd)
            send({"type": "acked"})
        else:
            send({"type": "error", "message": f"unknown request {kind}"})


if __name__ == "__main__":
    main()
