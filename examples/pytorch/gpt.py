"""A small GPT trained with DistributedDataParallel: characters of a text file (Multi30k's English
captions in the examples), nanoGPT's shape on torch.nn's layers. A plain torchrun script: run it
with `torchrun --nproc-per-node 2 gpt.py --data train.en.gz`, or under ferrotrain
(examples/pytorch-dt.yaml: spec.pytorch, docs/pytorch.md).

It keeps its own checkpoint (--checkpoint-dir, rank 0, every --checkpoint-every steps) and starts
from it, as torchrun scripts do. Three calls of ferrotrain's Python package (python/ferrotrain,
each a no-op outside ferrotrain's launcher; --no-ferrotrain leaves them out):

    start = ferrotrain.resume(model, optimizer, scheduler, step=own)   # a survivor's state, if newer
    ferrotrain.step_done(step + 1)                                     # the state is whole
    ferrotrain.report(step=step + 1, loss=..., tokens=..., total_steps=...)

Batches and dropout are functions of (seed, step), so a run that resumes at step N trains what
an uninterrupted run trains from N, and rank 0's loss curve is the same under torchrun and
under ferrotrain. Rank 0 appends a JSON line per step to --log-file: step, loss, time, and the
restart it ran in (TORCHELASTIC_RESTART_COUNT, which torchrun and ferrotrain both set).
"""

import argparse
import gzip
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import ferrotrain
except ImportError:  # the script runs without the package too
    ferrotrain = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a text file (.gz accepted), one example a line")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--block", type=int, default=64, help="characters per sequence")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--log-file", default=None, help="rank 0: a JSON line per step")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-ferrotrain", action="store_true", help="leave out ferrotrain's calls")
    return p.parse_args()


def read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


class GPT(nn.Module):
    def __init__(self, vocab, block, d, heads, layers, dropout):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(block, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block))
        for e in (self.tokens, self.positions):
            nn.init.normal_(e.weight, std=0.02)

    def forward(self, x, y):
        t = x.size(1)
        h = self.drop(self.tokens(x) + self.positions.weight[:t])
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        logits = self.norm(h) @ self.tokens.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def batch(data, step, rank, world, args, split_seed=0):
    """Rank `rank`'s share of step `step`'s global batch: a function of (seed, step) only."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + split_seed * 7919 + step)
    starts = torch.randint(len(data) - args.block - 1, (world * args.batch,), generator=g)
    mine = starts[rank * args.batch:(rank + 1) * args.batch]
    x = torch.stack([data[s:s + args.block] for s in mine])
    y = torch.stack([data[s + 1:s + args.block + 1] for s in mine])
    return x, y


def lr_at(step, args):
    if step < args.warmup:
        return (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def load_checkpoint(path, model, optimizer, scheduler):
    """The script's own checkpoint (every rank reads it): the steps it holds, 0 without one."""
    if not path or not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def save_checkpoint(path, model, optimizer, scheduler, step):
    tmp = f"{path}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main():
    args = parse_args()
    calls = ferrotrain if (ferrotrain is not None and not args.no_ferrotrain) else None
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    text = read_text(args.data)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(len(data) * 0.95)
    train, valid = data[:cut], data[cut:]

    torch.manual_seed(args.seed)
    model = GPT(len(chars), args.block, args.d_model, args.heads, args.layers, args.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, args))
    ckpt = None
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        ckpt = os.path.join(args.checkpoint_dir, "gpt.pt")
    own = load_checkpoint(ckpt, model, optimizer, scheduler)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    start = calls.resume(model, optimizer, scheduler, step=own) if calls else own
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"gpt: {params} parameters, vocabulary {len(chars)}, world {world}, "
              f"from step {start}", flush=True)
    log = open(args.log_file, "a") if (rank == 0 and args.log_file) else None
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)

    for step in range(start, args.steps):
        torch.manual_seed(args.seed + step * world + rank)  # dropout: a function of the step
        x, y = batch(train, step, rank, world, args)
        loss = ddp(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if calls:
            calls.step_done(step + 1)
        value = loss.item()
        eval_loss = None
        if args.eval_every and (step + 1) % args.eval_every == 0:
            eval_loss = evaluate(ddp, valid, step, rank, world, args, device)
        if calls:
            calls.report(step=step + 1, loss=value, tokens=world * args.batch * args.block,
                         samples=world * args.batch, eval_loss=eval_loss, total_steps=args.steps,
                         learning_rate=scheduler.get_last_lr()[0])
        if log:
            log.write(json.dumps({"step": step + 1, "loss": value, "time": time.time(),
                                  "restart": restart}) + "\n")
            log.flush()
        if rank == 0 and ((step + 1) % args.log_every == 0 or eval_loss is not None):
            extra = f" eval {eval_loss:.4f}" if eval_loss is not None else ""
            print(f"step {step + 1}/{args.steps} loss {value:.4f}{extra}", flush=True)
        if ckpt and rank == 0 and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(ckpt, model, optimizer, scheduler, step + 1)
    dist.destroy_process_group()


@torch.no_grad()
def evaluate(ddp, valid, step, rank, world, args, device):
    """The validation loss over 4 batches per rank, averaged over the ranks."""
    ddp.eval()
    total = torch.zeros(1, device=device)
    for i in range(4):
        x, y = batch(valid, step * 4 + i, rank, world, args, split_seed=1)
        total += ddp.module(x.to(device), y.to(device))
    ddp.train()
    dist.all_reduce(total)
    return total.item() / (4 * world)


if __name__ == "__main__":
    main()
