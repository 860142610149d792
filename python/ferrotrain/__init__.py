"""ferrotrain for PyTorch scripts: three optional calls for a script that `ferrotrain-launch`
runs (spec.pytorch; docs/pytorch.md).

    import ferrotrain

    start = ferrotrain.resume(model, optimizer)        # after init_process_group
    for step in range(start, total_steps):
        ...                                            # forward, backward, optimizer.step()
        ferrotrain.step_done(step + 1)                 # the state is whole: steps completed
        ferrotrain.report(step=step + 1, loss=loss, tokens=n, total_steps=total_steps)

- `report` writes rank 0's progress where the launcher serves it (/progress, /metrics), so the
  job's status shows step, rate, loss and ETA, and stalls are detected.
- `step_done` marks the state whole after a step; `resume` makes a surviving rank hand that
  state to the next round when a rank fails, and starts each round from the freshest state
  any rank holds: a kill -9 costs the step in flight, not the steps since your checkpoint.

Each is a no-op outside the launcher (nothing set in the environment), so the same script
runs under torchrun or alone. Standard library and torch only.
"""

import os

from . import _heal
from ._progress import reporter_from_env

__all__ = ["report", "step_done", "resume"]
__version__ = "0.2.0"

_reporter = None
_keeper = None


def _progress():
    global _reporter
    if _reporter is None:
        _reporter = reporter_from_env()
    return _reporter


def report(step, loss=None, tokens=None, samples=None, eval_loss=None, total_steps=None,
           learning_rate=None, epoch=None):
    """Rank 0's progress after `step` steps completed: the loss of the step (a float or a
    one-element tensor: `.item()` waits for the device), the tokens and samples it trained on
    (all ranks together), an evaluation's loss when there was one, and the run's length
    (`total_steps`, for the ETA). Written about once a second; other ranks write nothing."""
    _progress().record(step, loss=loss, tokens=tokens, samples=samples, eval_loss=eval_loss,
                       total_steps=total_steps, learning_rate=learning_rate, epoch=epoch)


def step_done(step):
    """Step `step` completed (counting steps completed, so `step + 1` in a loop from 0): the
    model and optimizer hold its state, which a surviving rank hands to the next round. Call it
    right after the optimizer's (and the LR scheduler's) step, before a collective of your own."""
    if _keeper is not None:
        _keeper.done(step)


def _group_device():
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(offer, own):
    """Every rank's (snapshot step, own step): the freshest snapshot and the rank that holds
    it (the lowest on a tie), and the newest step any rank loaded itself."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return offer, 0, own
    device = _group_device()
    mine = torch.tensor([offer, own], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    offers = [int(t[0]) for t in every]
    best = max(offers)
    return best, offers.index(best), max(int(t[1]) for t in every)


def _broadcast(data, source):
    """`data` (bytes, on the source) to every rank over the script's own process group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return data
    device = _group_device()
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, source)
    if data is not None:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buf, source)
    if data is not None:
        return data
    import ctypes

    received = buf.cpu().contiguous()
    return ctypes.string_at(received.data_ptr(), received.numel())


def resume(model, optimizer, *others, step=0):
    """Where this round starts: the freshest state a rank of the last round left (every rank
    then holds it: model, optimizer, `others`' state_dicts, the RNG) when it is newer than
    `step`, the step of the state your script loaded itself (its own checkpoint; 0 for a fresh
    start). Returns the steps completed. Call it on every rank, after init_process_group and
    after loading your own checkpoint; it also arranges for this rank to hand its state over
    when the round ends (see step_done)."""
    global _keeper
    _keeper = _heal.Keeper(model, optimizer, others)
    directory = _heal.heal_dir()
    progress = _progress()
    progress.parameters = sum(p.numel() for p in _keeper.model.parameters())
    if directory is None:
        _keeper.done(step)
        return step
    _heal.watch_signals(_keeper)
    _heal.hand_over_on_errors(_keeper)
    local = next((s for s in _heal.snapshots(directory)), None)
    best, source, own = _agree(local[0] if local else -1, int(step))
    rank = int(os.environ.get("RANK", "0") or 0)
    if best < 0 or best <= own:
        _keeper.done(own)
        if own > 0:
            progress.resumed_from_step, progress.healed_from = own, "checkpoint"
        return own
    data = None
    if rank == source:
        data = _heal.read_snapshot(local)
        if data is None:
            raise RuntimeError(f"heal: rank {rank}'s snapshot of step {best} is damaged")
    data = _broadcast(data, source)
    healed = _keeper.load(data)
    _keeper.done(healed)
    progress.resumed_from_step, progress.healed_from = healed, "peers"
    if rank == 0:
        print(f"ferrotrain: resuming from a peer's state step={healed} rank={source}", flush=True)
    return healed
