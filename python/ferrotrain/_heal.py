"""Losing only the step in flight, for a PyTorch script (docs/pytorch.md,
docs/losing-nothing.md): between steps a rank's model and optimizer hold the state of the last step
the gang completed, so when a round ends before the job does, a surviving rank writes that
state to its pod's heal directory (FERROTRAIN_HEAL_DIR), and the next round's ranks agree on
the freshest one any of them holds and receive it from that rank over the script's own process
group (`resume`).

A round ends for a survivor in one of two ways. A collective that a peer's death breaks raises
on the main thread: the exception's hook (sys.excepthook) writes the state, unless the
exception came in the middle of a step. Or the launcher stops it with SIGUSR1 (its "abandon":
the round ended elsewhere) or SIGTERM; the main thread may then be blocked in a collective (a
C++ call that runs no Python signal handler), so the handler is a thread woken through
Python's signal wakeup fd: it waits until no optimizer step is half done (the optimizer's step
pre-hook takes a lock that `step_done` gives back), writes the state, leaves its end record for
the launcher (kind abandoned or stopped: it only followed a peer) and exits.
"""

import io
import json
import os
import signal
import sys
import threading
import time
import zlib

from ._sealed import open_sealed, seal, write_atomically

HEAL_DIR = "FERROTRAIN_HEAL_DIR"
END_FILE = "FERROTRAIN_END_FILE"
SUBDIR = "python"
# How long the hand-over waits for a step in progress (the optimizer's update, then step_done).
STEP_GRACE = 5.0


def heal_dir():
    d = os.environ.get(HEAL_DIR)
    return os.path.join(d, SUBDIR) if d else None


def snapshots(directory):
    """(step, meta path, data path) of every snapshot whose meta is whole, newest first."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if not (name.startswith("state-") and name.endswith(".json")):
            continue
        meta_path = os.path.join(directory, name)
        try:
            with open(meta_path, "rb") as f:
                meta = open_sealed(f.read())
            found.append((int(meta["step"]), meta_path, meta_path[: -len(".json")] + ".pt", meta))
        except (OSError, ValueError, KeyError) as e:
            print(f"ferrotrain heal: {meta_path} skipped: {e}", flush=True)
    found.sort(key=lambda s: -s[0])
    return found


def read_snapshot(entry):
    """The bytes of a snapshot, once their size and CRC-32 match its meta; None otherwise."""
    step, meta_path, data_path, meta = entry
    try:
        with open(data_path, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"ferrotrain heal: {data_path} skipped: {e}", flush=True)
        return None
    if len(data) != meta.get("bytes") or zlib.crc32(data) != meta.get("crc32"):
        print(f"ferrotrain heal: {data_path} skipped: damaged (size or CRC-32)", flush=True)
        return None
    return data


def write_snapshot(directory, step, rank, data):
    """The state of `step` in `directory` (data, then its sealed meta, each renamed into
    place), unless a snapshot of that step is there; older snapshots are removed."""
    os.makedirs(directory, exist_ok=True)
    if any(s[0] == step for s in snapshots(directory)):
        return False
    base = os.path.join(directory, f"state-{step:08d}.rank-{rank}")
    write_atomically(base + ".pt", data)
    meta = {"step": step, "rank": rank, "bytes": len(data), "crc32": zlib.crc32(data)}
    write_atomically(base + ".json", seal(meta))
    for old_step, meta_path, data_path, _ in snapshots(directory):
        if old_step < step:
            for p in (meta_path, data_path):
                try:
                    os.remove(p)
                except OSError:
                    pass
    return True


def leave_end_record(kind, step, message):
    path = os.environ.get(END_FILE)
    if not path:
        return
    record = {"kind": kind, "message": message}
    if step is not None:
        record["step"] = step
    try:
        write_atomically(path, json.dumps(record).encode())
    except OSError:
        pass


def unwrap(model):
    """The module a DistributedDataParallel (or DataParallel, FSDP-less) wrapper holds."""
    return getattr(model, "module", model)


def rng_state():
    import torch

    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    import torch

    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Keeper:
    """What a rank hands over: its model, optimizer and other stateful objects (an LR
    scheduler, a GradScaler) as they are between steps, with the last step completed."""

    def __init__(self, model, optimizer, others):
        self.model, self.optimizer, self.others = unwrap(model), optimizer, list(others)
        self.between_steps = threading.Lock()
        self.in_step = False
        self.step = None
        self.rng = None
        self.leaving = threading.Lock()
        optimizer.register_step_pre_hook(self._step_starts)

    def _step_starts(self, *_):
        if not self.in_step:
            self.between_steps.acquire()
            self.in_step = True

    def done(self, step):
        """Step `step` completed (steps completed so far): the state is whole again."""
        self.step = int(step)
        self.rng = rng_state()
        if self.in_step:
            self.in_step = False
            self.between_steps.release()

    def state_bytes(self):
        import torch

        state = {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "others": [o.state_dict() for o in self.others],
            "rng": self.rng,
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def load(self, data):
        import torch

        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for obj, s in zip(self.others, state["others"]):
            obj.load_state_dict(s)
        if state.get("rng"):
            set_rng_state(state["rng"])
        return int(state["step"])

    def leave_state(self, whole):
        """Writes the state of the last completed step when it is `whole`; what happened."""
        directory = heal_dir()
        rank = int(os.environ.get("RANK", "0") or 0)
        if not whole:
            return (f"heal: no state left: an optimizer step was not followed by "
                    f"ferrotrain.step_done (within {STEP_GRACE:.0f} s)")
        if self.step is None or directory is None:
            return "heal: no state left: no step completed yet"
        started = time.monotonic()
        try:
            wrote = write_snapshot(directory, self.step, rank, self.state_bytes())
        except Exception as e:  # noqa: BLE001 - a full disk costs the hand-over only
            return f"heal: no state left: {e}"
        if not wrote:
            return f"heal: the state of step {self.step} is left by another rank already"
        took = time.monotonic() - started
        return f"heal: left the state of step {self.step} for the next round ({took:.2f} s)"

    def hand_over(self, signum):
        """The launcher ended the round (the signal thread): leave the state of the last
        completed step once no step is half done, then exit."""
        with self.leaving:
            whole = self.between_steps.acquire(timeout=STEP_GRACE)
            message = self.leave_state(whole)
            rank = os.environ.get("RANK", "0")
            print(f"ferrotrain rank {rank}: {message}", flush=True)
            kind = "abandoned" if signum == signal.SIGUSR1 else "stopped"
            name = signal.Signals(signum).name
            leave_end_record(kind, self.step, f"the round ended ({name}); {message}")
            os._exit(128 + signum)

    def hand_over_on_error(self):
        """An exception ends the script (a peer's death breaks a collective, on the main
        thread): the state is whole unless the exception came in the middle of a step."""
        with self.leaving:
            message = self.leave_state(not self.in_step)
            print(f"ferrotrain rank {os.environ.get('RANK', '0')}: {message}", flush=True)


_signal_thread = None
_hooked = False


def hand_over_on_errors(keeper):
    """An exception that ends the script hands the state over first (sys.excepthook)."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def hook(kind, error, tb):
        if not issubclass(kind, KeyboardInterrupt):
            keeper.hand_over_on_error()
        previous(kind, error, tb)

    sys.excepthook = hook



def watch_signals(keeper):
    """SIGUSR1 and SIGTERM hand the state over from a thread of their own (see the module)."""
    global _signal_thread
    if _signal_thread is not None or threading.current_thread() is not threading.main_thread():
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def watch():
        while True:
            for signum in os.read(read, 64):
                if signum in (signal.SIGUSR1, signal.SIGTERM):
                    keeper.hand_over(signum)

    _signal_thread = threading.Thread(target=watch, name="ferrotrain-heal", daemon=True)
    _signal_thread.start()
