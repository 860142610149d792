#!/usr/bin/env python3
"""bench/restart-speed.sh's local half: kill -9 of a rank's process (and SIGSTOP of one), N times, and the time
from each kill to the next completed step, with `ferrotrain launch` on this machine, in the
shapes a cluster runs: one launcher of two ranks (a machine of two GPUs), two launchers of one
rank (two pods) and two launchers of two ranks, on 127.0.0.1; every rank restarted in place in
a new round, the launchers never exiting; with the spare trainers that wait for the next round
(launch/spare.rs) and without them (--spare-ranks false).

The next step's time is the launcher's own ledger (--recovery-file: the first step of the
next round). Prints a Markdown table: median, max, each.

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


def run(binary, kills, nodes, nproc, victim, spares=True, sig=signal.SIGKILL):
    """`nodes` launchers of `nproc` ranks each (one launcher: a machine of several GPUs; more:
    in place, as pods); `sig` (kill -9, or SIGSTOP: a frozen rank) to global rank `victim` KILLS times, each once its round has
    trained a few seconds. Returns the seconds from each kill to the next round's first step."""
    work = tempfile.mkdtemp(prefix="restart-speed-")
    if os.environ.get("RESTART_SPEED_KEEP"):
        print(f"work dir {work}", file=sys.stderr)
    with open(os.path.join(work, "job.yaml"), "w") as f:
        f.write(CONFIG)
    ledger = os.path.join(work, "recovery.json")
    common = ["--max-restarts", str(kills + 2), "--stop-grace-seconds", "3",
              "--restart-backoff-seconds", "0", "--nproc-per-node", str(nproc),
              "--spare-ranks", "true" if spares else "false"]
    env = {"FERROTRAIN_CHECKPOINT_DIR": os.path.join(work, "runs"), "FERROTRAIN_RDZV_TOKEN": "bench"}
    port = free_port()
    procs = [launch(binary, work, ["--nnodes", str(nodes), "--node-rank", str(n), "--master-addr",
                                   "127.0.0.1", "--master-port", str(port), "--restart-in-place",
                                   "--recovery-file", ledger if n == 0 else f"{ledger}.node-{n}",
                                   *common], f"node-{n}", env) for n in range(nodes)]
    victim_parent = procs[victim // nproc].pid
    killed = []
    try:
        for i in range(kills):
            want = [f"RANK={victim}", f"FERROTRAIN_ROUND={i}"]
            pid = wait(f"rank {victim} of round {i}", 60,
                       lambda: children_with(victim_parent, want))[0]
            # Let it train a little: past its first step, a checkpoint and the start of the
            # next round's spare trainers, 3 s into a round (launch/spare.rs).
            time.sleep(5)
            killed.append(time.time())
            os.kill(pid, sig)
        wait("the last restart", 60,
             lambda: children_with(victim_parent, [f"RANK={victim}", f"FERROTRAIN_ROUND={kills}"]))
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
    # By round: the ledger keeps only the last records, and round i is the one killed i-th.
    first_step = {r.get("round", 0): r.get("firstStepAt") for r in records}
    took = []
    for i, at in enumerate(killed):
        nxt = first_step.get(i + 1)
        took.append(ts(nxt) - at if nxt else float("nan"))
    return took


def main():
    binary = sys.argv[1]
    kills = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = [("1 launcher x 2 ranks, rank 1 killed, spare trainers", run(binary, kills, 1, 2, 1)),
            ("1 launcher x 2 ranks, rank 0 killed, spare trainers", run(binary, kills, 1, 2, 0)),
            ("1 launcher x 2 ranks, rank 1 killed, no spares", run(binary, kills, 1, 2, 1, False)),
            ("2 launchers x 1 rank, rank 1 killed, spare trainers", run(binary, kills, 2, 1, 1)),
            ("2 launchers x 1 rank, rank 1 killed, no spares", run(binary, kills, 2, 1, 1, False)),
            ("2 launchers x 2 ranks, rank 2 killed, spare trainers", run(binary, kills, 2, 2, 2)),
            ("2 launchers x 2 ranks, rank 3 stopped (SIGSTOP), spare trainers",
             run(binary, kills, 2, 2, 3, True, signal.SIGSTOP))]
    print("\n| local launchers (in place, rounds) | failures | next step after the failure: median | max | each |")
    print("|---|---|---|---|---|")
    for name, took in rows:
        ok = sorted(t for t in took if t == t)
        print(f"| {name} | {len(took)} | {statistics.median(ok):.2f} s | {max(ok):.2f} s | "
              f"{', '.join(f'{t:.2f}' for t in took)} |")


if __name__ == "__main__":
    main()
