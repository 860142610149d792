#!/usr/bin/env python3
"""kill -9 of rank 1 of a PyTorch DDP script (examples/pytorch/gpt.py, 2 ranks on this machine,
gloo on the CPU), N times in one run, and the time from each kill to the next completed step,
with the steps trained twice; p50 and max. The ways a run recovers:

  inplace         ferrotrain-launch, the package's three calls: in place, from warm spares,
                  the state a survivor left
  inplace-cold    the same without spares (FERROTRAIN_SPARE_RANKS=false): new processes
  zero-lines      ferrotrain-launch, the script without the calls (--no-ferrotrain), its own
                  checkpoint every 25 steps: in place, from spares, from the checkpoint
  torchrun        torchrun --max-restarts N, the script without the calls, its own checkpoint
                  every 25 steps: torchrun's agent restarts every worker (new processes)

Each kill comes once the run has trained 15 steps past its last recovery and 12 s have passed
(the spares start 3 s into a round and import torch meanwhile). The next step is the first
that rank 0 logs in a later restart (--log-file: rank 0's time of each step and its
TORCHELASTIC_RESTART_COUNT): not the old round's step in flight, which rank 0 may still
complete and log after the kill. Steps trained twice: the steps the run had logged that the
next restart logs again.

    PYTHONPATH=$(scripts/setup-pytorch.sh | tail -1):python \\
      python3 bench/pytorch_restart.py target/release/ferrotrain-launch [KILLS] [MODES]
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples/pytorch/gpt.py")
DATA = os.path.join(ROOT, "../shared/data/multi30k/train.en.gz")
SETTLE = 12.0
# A kill whose next step has not come within this many seconds ends that mode's run.
RECOVER_LIMIT = 120.0


class Stuck(RuntimeError):
    """A kill the run did not recover from in time, with the kills it did recover from."""

    def __init__(self, message, results):
        super().__init__(message)
        self.results = results


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            comm = open(f"/proc/{d}/comm").read().strip()
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if ppid == pid:
            out.append((int(d), comm, env))
    return out


def rank_pid(parent, rank, killed):
    for pid, comm, env in children(parent):
        if comm != "ft-spare" and f"RANK={rank}".encode() in env and pid not in killed:
            return pid
    return None


def steps(log):
    try:
        return [json.loads(line) for line in open(log)]
    except (OSError, ValueError):
        return []


def run(mode, launcher, kills, workdir):
    log = os.path.join(workdir, f"{mode}.jsonl")
    args = [SCRIPT, "--data", DATA, "--steps", "100000", "--log-file", log, "--eval-every", "0"]
    if mode in ("zero-lines", "torchrun"):
        args += ["--no-ferrotrain", "--checkpoint-dir", os.path.join(workdir, mode), "--checkpoint-every", "25"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if mode == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(kills + 1)] + args
    else:
        cmd = [launcher, "--nproc-per-node", "2", "--master-port", "0", "--max-restarts", str(kills + 1),
               "--restart-backoff-seconds", "0", sys.executable] + args
        if mode == "inplace-cold":
            env["FERROTRAIN_SPARE_RANKS"] = "false"
    output = open(os.path.join(workdir, f"{mode}.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT)
    results, killed = [], set()
    try:
        ready_at, last_step = time.time(), 0
        while len(results) < kills:
            s = steps(log)
            if proc.poll() is not None:
                raise RuntimeError(f"{mode}: the run ended ({proc.returncode})")
            if not s or s[-1]["step"] < last_step + 15 or time.time() < ready_at + SETTLE:
                time.sleep(0.05)
                continue
            pid = rank_pid(proc.pid, 1, killed)
            if pid is None:
                time.sleep(0.05)
                continue
            restart = s[-1].get("restart", 0)
            t = time.time()
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
            while True:
                s = steps(log)
                after = [x for x in s if x.get("restart", 0) > restart]
                if after:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"{mode}: the run ended ({proc.returncode})")
                if time.time() > t + RECOVER_LIMIT:
                    raise Stuck(f"no step {RECOVER_LIMIT:.0f} s after kill {len(results) + 1}", results)
                time.sleep(0.02)
            first = after[0]
            before = max(x["step"] for x in s if x.get("restart", 0) <= restart)
            results.append((first["time"] - t, max(0, before - first["step"] + 1)))
            ready_at, last_step = first["time"], first["step"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return results


class _Kept:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        return False


def main():
    launcher = sys.argv[1]
    kills = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    modes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["inplace", "inplace-cold", "zero-lines", "torchrun"]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d')}, {commit}, {os.cpu_count()} cores, {kills} kills of rank 1 each\n")
    print("| how | failure -> next step p50 | max | steps trained twice (p50, max) | each (s) |")
    print("|---|---|---|---|---|")
    # BENCH_KEEP=DIR keeps each run's step log and output there.
    keep = os.environ.get("BENCH_KEEP")
    if keep:
        os.makedirs(keep, exist_ok=True)
    with (tempfile.TemporaryDirectory() if not keep else _Kept(keep)) as workdir:
        for mode in modes:
            note = ""
            try:
                r = run(mode, launcher, kills, workdir)
            except Stuck as e:
                r, note = e.results, f" ({e})"
            except RuntimeError as e:
                print(f"| {mode} | {e} | | | |", flush=True)
                continue
            if not r:
                print(f"| {mode}{note} | | | | |", flush=True)
                continue
            secs = [x[0] for x in r]
            twice = [x[1] for x in r]
            each = " ".join(f"{x:.2f}" for x in secs)
            print(f"| {mode}{note} | {statistics.median(secs):.2f} s | {max(secs):.2f} s | "
                  f"{statistics.median(twice):.0f}, {max(twice)} | {each} |", flush=True)


if __name__ == "__main__":
    main()
