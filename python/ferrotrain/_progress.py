"""Rank 0's progress report, in the file the launcher serves (FERROTRAIN_PROGRESS_FILE): the JSON
of api/src/progress.rs's `Progress`, sealed with its CRC-32C (api/src/checksummed.rs). The
rates, the loss and the ETA are computed as ferrotrain's own trainer computes them
(trainer/src/train/window.rs, report.rs): over a window of the last 20 steps."""

import atexit
import math
import os
import time
from collections import deque
from datetime import datetime, timezone

from ._sealed import seal, write_atomically

PROGRESS_FILE = "FERROTRAIN_PROGRESS_FILE"
ROUND = "FERROTRAIN_ROUND"
WINDOW = 20
# The launcher reads the file about once a second; rank 0 writes it no more often.
WRITE_EVERY = 1.0


def _finite(x):
    """A float of `x` (a number or a one-element tensor), or None when it is not finite."""
    if x is None:
        return None
    if hasattr(x, "item"):
        x = x.item()
    x = float(x)
    return x if math.isfinite(x) else None


def now_rfc3339(t=None):
    t = datetime.now(timezone.utc) if t is None else datetime.fromtimestamp(t, timezone.utc)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


class Reporter:
    """What rank 0 knows of its run, written to `path` (None: nothing is written)."""

    def __init__(self, path, world_size, clock=time.monotonic, wall=time.time, round=0):
        self.path = path
        self.clock, self.wall = clock, wall
        self.world_size = world_size
        # The round the report is of (the launcher serves it on after the next round began).
        self.round = round
        self.total_steps = 0
        self.epoch = 0
        self.samples = 0
        self.steps = deque(maxlen=WINDOW)  # (seconds, tokens, samples) per step
        self.losses = deque(maxlen=WINDOW)
        self.last_step = None
        self.last_time = None
        self.first_step_time = None
        self.eval = {}
        self.best_eval_loss = None
        self.learning_rate = None
        self.resumed_from_step = None
        self.healed_from = None
        self.parameters = 0
        self.written_at = None

    def record(self, step, loss=None, tokens=None, samples=None, eval_loss=None,
               total_steps=None, learning_rate=None, epoch=None):
        """Step `step` completed (steps completed so far); writes the report when due."""
        step = int(step)
        t = self.clock()
        if total_steps is not None:
            self.total_steps = int(total_steps)
        if epoch is not None:
            self.epoch = int(epoch)
        if learning_rate is not None:
            self.learning_rate = _finite(learning_rate)
        if samples is not None:
            self.samples += int(samples)
        if self.last_step is not None and step > self.last_step:
            per = (t - self.last_time) / (step - self.last_step)
            for _ in range(min(step - self.last_step, WINDOW)):
                self.steps.append((per, (tokens or 0) / (step - self.last_step),
                                   (samples or 0) / (step - self.last_step)))
        if self.first_step_time is None and (self.last_step is None or step > self.last_step):
            self.first_step_time = now_rfc3339(self.wall())
        if step != self.last_step or self.last_time is None:
            self.last_step, self.last_time = step, t
        loss = _finite(loss)
        if loss is not None:
            self.losses.append(loss)
        eval_loss = _finite(eval_loss)
        if eval_loss is not None:
            self.eval = {"evalLoss": eval_loss, "evalStep": step}
            if self.best_eval_loss is None or eval_loss < self.best_eval_loss:
                self.best_eval_loss = eval_loss
        due = self.written_at is None or t - self.written_at >= WRITE_EVERY or eval_loss is not None
        if due:
            self.write(t)

    def report(self, phase="training"):
        """The report now, as api/src/progress.rs's Progress (camelCase JSON)."""
        step = self.last_step or 0
        p = {
            "phase": phase,
            "step": step,
            "totalSteps": self.total_steps,
            "epoch": self.epoch,
            "samples": self.samples,
            "worldSize": self.world_size,
            "parameters": self.parameters,
        }
        secs = sum(s[0] for s in self.steps)
        if secs > 0:
            n = len(self.steps)
            p["stepsPerSecond"] = n / secs
            p["stepTimeSeconds"] = secs / n
            tokens = sum(s[1] for s in self.steps)
            samples = sum(s[2] for s in self.steps)
            if tokens:
                p["tokensPerSecond"] = tokens / secs
            if samples:
                p["samplesPerSecond"] = samples / secs
            if self.total_steps:
                left = max(self.total_steps - step, 0)
                p["etaSeconds"] = left / p["stepsPerSecond"]
        if phase == "finished" or (self.total_steps and step >= self.total_steps):
            p["etaSeconds"] = 0.0
        if self.losses:
            p["loss"] = sum(self.losses) / len(self.losses)
        p.update(self.eval)
        if self.best_eval_loss is not None:
            p["bestEvalLoss"] = self.best_eval_loss
        if self.learning_rate is not None:
            p["learningRate"] = self.learning_rate
        if self.round:
            p["round"] = self.round
        if self.resumed_from_step is not None:
            p["resumedFromStep"] = self.resumed_from_step
        if self.healed_from is not None:
            p["healedFrom"] = self.healed_from
        if self.first_step_time is not None:
            p["attemptFirstStepTime"] = self.first_step_time
        return p

    def write_last(self):
        if self.last_step is None:
            return
        done = bool(self.total_steps) and self.last_step >= self.total_steps
        self.write(phase="finished" if done else "training")

    def write(self, t=None, phase="training"):
        self.written_at = self.clock() if t is None else t
        if not self.path:
            return
        try:
            write_atomically(self.path, seal(self.report(phase)))
        except OSError as e:  # a full disk costs the report, not the run
            print(f"ferrotrain: progress not written to {self.path}: {e}", flush=True)


def reporter_from_env():
    """Rank 0's reporter (the file the launcher gave it), or one that writes nothing. Rank 0
    writes its last report as the process exits: the launcher passes it on as the run's final
    one (its termination message)."""
    rank = int(os.environ.get("RANK", "0") or 0)
    path = os.environ.get(PROGRESS_FILE) if rank == 0 else None
    reporter = Reporter(path, int(os.environ.get("WORLD_SIZE", "1") or 1),
                        round=int(os.environ.get(ROUND, "0") or 0))
    if path:
        atexit.register(reporter.write_last)
    return reporter
