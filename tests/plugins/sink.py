#!/usr/bin/env python3
"""A runtime-protocol sink for the end-to-end tests (version 1, or 2 with
PROTOCOL=2).

With REFUSE_FIELD=F (version 2) it refuses every record whose field F is
true, naming each with the reason "<F> is set" (nothing of such a batch is
applied, as the protocol asks).

With FATAL_FIELD=F it answers fatal to every batch holding a record whose
field F is true (a version 1 sink cannot name the record).

With REFUSE=retryable (or fatal) it answers that to every batch; with
LAG_SECONDS=S it answers retryable for S seconds after it starts, then
applies (a sink that is down for a while). Without OUT_DIR it keeps
nothing: each batch is applied by counting it (BENCHMARKS.md's lagging sink).
Writes each batch to OUT_DIR/<stream>/<seq, 20 digits>-<compaction_id>.jsonl
(temporary file, fsync, rename), one record per line as received. A replay of
the same id with the same records is already_applied; anything else under a
number already used is fatal. Every result echoes the request's seq and
compaction_id, as docs/PROTOCOL.md recommends.

Misbehaving on purpose, once per MARKER file: DOUBLE_FIRST=1 prints the
result of its first apply twice (a stale second answer), and
RETRYABLE_SECOND=1 answers retryable to its second apply without applying
it. NO_ECHO=1 leaves the echoes out. KILL_DAEMON_AFTER=N SIGKILLs the
daemon that started it once it has applied N batches, before answering the
Nth (a crash at a point counted, not timed).
"""
import json
import os
import signal
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


def daemon_pid():
    """The skipprd process among this one's parents (a shell may stand
    between them)."""
    pid = os.getppid()
    for _ in range(3):
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "skipprd":
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise SystemExit("sink.py: no skipprd among this process's parents")


def first_time():
    """True the first time it is asked across restarts (MARKER remembers)."""
    marker = os.environ.get("MARKER")
    if not marker or os.path.exists(marker):
        return not marker
    open(marker, "w").close()
    return True


def main():
    lag_until = time.monotonic() + float(os.environ.get("LAG_SECONDS", "0"))
    applies = 0
    applied = 0
    kill_after = int(os.environ.get("KILL_DAEMON_AFTER", "0"))
    misbehave = (os.environ.get("DOUBLE_FIRST") or os.environ.get("RETRYABLE_SECOND")) and first_time()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["type"] == "hello":
            send({"type": "hello", "protocol": int(os.environ.get("PROTOCOL", "1"))})
        elif msg["type"] == "apply":
            applies += 1
            refuse = os.environ.get("REFUSE") or (time.monotonic() < lag_until and "retryable")
            if misbehave and applies == 2 and os.environ.get("RETRYABLE_SECOND"):
                refuse = "retryable"
            field = os.environ.get("REFUSE_FIELD")
            bad = [i for i, r in enumerate(msg["records"]) if field and isinstance(r, dict) and r.get(field) is True]
            # The ledger first: a number already held is a replay (or a
            # conflict), never refused.
            held = OUT_DIR and os.path.isdir(os.path.join(OUT_DIR, msg["stream"])) and any(
                n.startswith(f"{msg['seq']:020}-") for n in os.listdir(os.path.join(OUT_DIR, msg["stream"])))
            if bad and not refuse and not held:
                refuse = "refused"
            fatal = os.environ.get("FATAL_FIELD")
            if fatal and not held and any(isinstance(r, dict) and r.get(fatal) is True for r in msg["records"]):
                refuse = "fatal"
            outcome = refuse if refuse else apply(msg)
            if outcome == "applied":
                applied += 1
                if applied == kill_after:
                    os.kill(daemon_pid(), signal.SIGKILL)
                    sys.exit(0)
            result = {"type": "result", "outcome": outcome, "rows": len(msg["records"])}
            if outcome == "refused":
                result["refused"] = [{"index": i, "reason": f"{field} is set"} for i in bad]
            if not os.environ.get("NO_ECHO"):
                result.update(seq=msg["seq"], compaction_id=msg["compaction_id"])
            send(result)
            if misbehave and applies == 1 and os.environ.get("DOUBLE_FIRST"):
                send(result)
        else:
            send({"type": "error", "message": f"unknown request {msg['type']}"})


if __name__ == "__main__":
    main()
