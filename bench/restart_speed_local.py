#!/usr/bin/env python3
"""bench/restart-speed.sh's local half: kill -9 of rank 1's process, N times, and the time
from each kill to the next completed step, with `ferrotrain launch` on this machine:

- in place: two launchers (nodes 0 and 1, one rank each, --restart-in-place) on 127.0.0.1,
  every rank restarted in a new round, the launchers never exiting; with the spare trainers
  that wait for the next round (launch/spare.rs) and without them (--spare-ranks false);
- group restart: one launcher of two ranks (a single node restarts its whole group), with
  spare trainers for the next attempt and without them.

The next step's time is the launcher's own ledger (--recovery-file: the first step of the
next round or attempt). Prints a Markdown table: median, max, each.

    restart_speed_local.py FERROTRAIN_BINARY [KILLS]
"""
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

CONFIG = """task: copy
seed: 5
maxSteps: 100000000
copy: {symbols: 12, minLength: 3, maxLength: 8, trainSamples: 4000, validSamples: 32}
model: {dModel: 32, heads: 2, encoderLayers: 1, decoderLayers: 1, ffnDim: 64, dropout: 0.0, maxPositions: 16}
batch: {maxTokens: 512}
optimizer: {lr: 0.003}
schedule: {kind: inverseSqrt, warmupSteps: 10}
labelSmoothing: 0.0
eval: {everySteps: 0, beamSize: 1}
checkpoint: {everySteps: 20, keepLatest: 2}
distributed: {collectiveTimeoutSeconds: 10, rendezvousTimeoutSeconds: 30}
logEverySteps: 1000
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_with(parent, want):
    """Pids of `parent`'s children whose environment holds every KEY=VALUE of `want`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except (OSError, ValueError, IndexError):
            continue
        if all(w.encode() in env for w in want):
            found.append(int(pid))
    return found


def wait(what, limit, check):
    deadline = time.time() + limit
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def launch(binary, work, args, name, env):
    log = open(os.path.join(work, f"{name}.log"), "w")
    full_env = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG="info", **env)
    for k in ("FERROTRAIN_ATTEMPT", "FERROTRAIN_METRICS_PORT"):
        full_env.pop(k, None)
    return subprocess.Popen(
        [binary, "launch", "--config", os.path.join(work, "job.yaml"), *args],
        stdout=subprocess.DEVNULL, stderr=log, env=full_env)


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def run(binary, kills, in_place, spares=True):
    work = tempfile.mkdtemp(prefix="restart-speed-")
    with open(os.path.join(work, "job.yaml"), "w") as f:
        f.write(CONFIG)
    ledger = os.path.join(work, "recovery.json")
    common = ["--max-restarts", str(kills + 2), "--stop-grace-seconds", "3",
              "--restart-backoff-seconds", "0"]
    env = {"FERROTRAIN_CHECKPOINT_DIR": os.path.join(work, "runs"), "FERROTRAIN_RDZV_TOKEN": "bench"}
    if in_place:
        port = free_port()
        procs = [launch(binary, work, ["--nnodes", "2", "--node-rank", str(n), "--master-addr",
                                       "127.0.0.1", "--master-port", str(port), "--restart-in-place",
                                       "--recovery-file", ledger if n == 0 else ledger + ".node-1",
                                       "--spare-ranks", "true" if spares else "false",
                                       *common], f"node-{n}", env) for n in (0, 1)]
        victim_parent, key = procs[1].pid, "FERROTRAIN_ROUND"
    else:
        procs = [launch(binary, work, ["--nproc-per-node", "2", "--master-port", "0",
                                       "--recovery-file", ledger,
                                       "--spare-ranks", "true" if spares else "false",
                                       *common], "group", env)]
        victim_parent, key = procs[0].pid, "FERROTRAIN_ATTEMPT"
    killed = []
    try:
        for i in range(kills):
            want = ["RANK=1", f"{key}={i}"]
            pid = wait(f"rank 1 of {key} {i}", 60, lambda: children_with(victim_parent, want))[0]
            # Let it train a little: past its first step, a checkpoint and (in place) the
            # start of the next round's spare trainers, 3 s into a round (launch/spare.rs).
            time.sleep(5)
            killed.append(time.time())
            os.kill(pid, signal.SIGKILL)
        wait("the last restart", 60,
             lambda: children_with(victim_parent, ["RANK=1", f"{key}={kills}"]))
        time.sleep(3)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    with open(ledger) as f:
        records = json.load(f)["attempts"]
    took = []
    for i, at in enumerate(killed):
        nxt = records[i + 1].get("firstStepAt") if i + 1 < len(records) else None
        took.append(ts(nxt) - at if nxt else float("nan"))
    return took


def main():
    binary = sys.argv[1]
    kills = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = [("in place, 2 launchers (rounds), spare trainers", run(binary, kills, True)),
            ("in place, 2 launchers, no spares", run(binary, kills, True, spares=False)),
            ("whole group, 1 launcher (attempts), spare trainers", run(binary, kills, False)),
            ("whole group, 1 launcher, no spares", run(binary, kills, False, spares=False))]
    print("\n| local launcher restart | kills | next step after the kill: median | max | each |")
    print("|---|---|---|---|---|")
    for name, took in rows:
        ok = sorted(t for t in took if t == t)
        print(f"| {name} | {len(took)} | {statistics.median(ok):.2f} s | {max(ok):.2f} s | "
              f"{', '.join(f'{t:.2f}' for t in took)} |")


if __name__ == "__main__":
    main()
