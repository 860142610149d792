"""ferrotrain-launch's Python rank runner (launch/src/python/mod.rs embeds this file and runs
it as `python [flags] -c <this file> path|module <script or module> [args...]`).

A rank started directly runs its script at once. A spare (FERROTRAIN_SPARE set) first imports
torch (with what a DDP script's first steps import: torch.distributed, DDP, and
torch._dynamo, which the first optimizer imports: 2.2 s of the 3.9 s here) and the modules
FERROTRAIN_PRE_IMPORT names, then waits for the round's environment on stdin (one JSON object
on one line), sets it and runs the script: a restart does not pay Python's start-up and
those imports. EOF on stdin (no round for it) ends it quietly.

The script runs as `__main__` with the sys.argv and sys.path[0] that `python script.py args`
(or `python -m module args`) gives it. An exception that ends it is told to the launcher as
the trainer tells its failures (sys.excepthook, so that a hook the script or ferrotrain's
package sets runs too): its last line in FERROTRAIN_TERMINATION_LOG and, when it says
that a peer's connection broke or a collective timed out (gloo, NCCL, the TCPStore), an end
record in FERROTRAIN_END_FILE (kind peerFailed or peerSilent), so that a rank that only saw a
peer die is not blamed for it. Standard library only: a script that imports nothing of
ferrotrain's runs under it unchanged.
"""

import json
import os
import sys

SPARE = "FERROTRAIN_SPARE"
PRE_IMPORT = "FERROTRAIN_PRE_IMPORT"
TERMINATION_LOG = "FERROTRAIN_TERMINATION_LOG"
END_FILE = "FERROTRAIN_END_FILE"
SPARE_NAME = b"ft-spare"
# What a spare imports before it waits, besides FERROTRAIN_PRE_IMPORT's.
WARM = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"]

# What a broken peer's link says (gloo's pair.cc, NCCL, c10d's TCPStore), and a timeout's.
PEER_BROKE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
    "Connection refused",
    "DistNetworkError",
    "NCCL communicator was aborted",
)
PEER_SILENT = ("Timed out waiting", "Socket Timeout", "timed out after")


def set_process_name(name):
    """/proc/self/comm, what ps and pgrep show (15 bytes at most)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except Exception:  # noqa: BLE001 - a name is a convenience
        pass


def wait_as_spare():
    """Imports what a rank will, then takes the round's environment from stdin."""
    os.environ.pop(SPARE, None)
    set_process_name(SPARE_NAME)
    for module in WARM + [m for m in os.environ.get(PRE_IMPORT, "").split(",") if m]:
        try:
            __import__(module.strip())
        except Exception as e:  # noqa: BLE001 - the script's own import will say it
            print(f"ferrotrain spare: cannot pre-import {module}: {e}", file=sys.stderr)
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    os.environ.update(json.loads(line))
    os.environ.pop(SPARE, None)
    set_process_name(os.path.basename(sys.executable).encode())


def end_kind(error):
    text = f"{type(error).__name__}: {error}"
    if any(sign in text for sign in PEER_BROKE):
        return "peerFailed"
    if type(error).__name__ in ("DistBackendError", "DistStoreError") or any(
        sign in text for sign in PEER_SILENT
    ):
        return "peerSilent"
    return None


def tell_launcher(error):
    """The failure's words for the launcher (and kubectl describe), and its kind if known."""
    last = (f"{type(error).__name__}: {error}".strip().splitlines() or [""])[-1][:3800]
    log = os.environ.get(TERMINATION_LOG)
    if log:
        try:
            with open(log, "w") as f:
                f.write(last)
        except OSError:
            pass
    kind, path = end_kind(error), os.environ.get(END_FILE)
    if kind and path:
        try:
            with open(path + ".tmp", "w") as f:
                json.dump({"kind": kind, "message": last}, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def run(mode, target, args):
    import runpy

    if mode == "module":
        sys.argv = [target] + args
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target] + args
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def excepthook(previous):
    """Tells the launcher, after what the hook before said (the traceback), then exits 1 at
    once: an interpreter's shutdown with a collective's threads still running can abort
    (`terminate called without an active exception`), which would read as a signal's death."""

    def hook(kind, error, tb):
        previous(kind, error, tb)
        if not issubclass(kind, KeyboardInterrupt):
            tell_launcher(error)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    return hook


def main():
    mode, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if os.environ.get(SPARE):
        wait_as_spare()
    sys.excepthook = excepthook(sys.excepthook)
    run(mode, target, args)


main()
