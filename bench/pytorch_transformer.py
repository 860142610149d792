"""Throughput of the same transformer recipe in plain PyTorch eager, for comparison with
ferrotrain on the same machine (see bench/README.md).

  bench/run-pytorch-baseline.sh [--steps 60] [--threads 2]

It reuses the BPE vocabulary ferrotrain learned (tokenizer.json), builds the same model
(pre-LN encoder-decoder with tied embeddings; its sizes from the `model:` section of --config,
by default d_model 256, 4 heads, 3+3 layers, ffn 512), label smoothing 0.1, AdamW 2e-3, 300
warmup steps, inverse-sqrt decay, batches Multi30k by at most 2000 padded tokens per side,
and prints steps/s and real source+target tokens/s.
"""
import argparse
import gzip
import math
import random
import re
import time

import torch
import torch.nn as nn
from tokenizers import Tokenizer

PAD, BOS, EOS = 0, 1, 2


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


class Model(nn.Module):
    def __init__(self, vocab, d=256, heads=4, enc_layers=3, dec_layers=3, ffn=512, dropout=0.1, max_len=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, 0, d ** -0.5)
        self.core = nn.Transformer(d, heads, enc_layers, dec_layers, ffn, dropout, batch_first=True,
                                   norm_first=True)
        pos = torch.arange(max_len).unsqueeze(1)
        freq = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.stack([torch.sin(pos * freq), torch.cos(pos * freq)], 2).view(max_len, d)
        self.register_buffer("pe", pe)
        self.scale = d ** 0.5
        self.drop = nn.Dropout(dropout)

    def emb(self, x):
        return self.drop(self.embed(x) * self.scale + self.pe[: x.size(1)])

    def states(self, src, tgt):
        mask = self.core.generate_square_subsequent_mask(tgt.size(1), device=src.device)
        return self.core(self.emb(src), self.emb(tgt), tgt_mask=mask, tgt_is_causal=True,
                         src_key_padding_mask=src.eq(PAD), memory_key_padding_mask=src.eq(PAD))

    def forward(self, src, tgt):
        return self.states(src, tgt) @ self.embed.weight.t()


# ferrotrain's `model:` keys and the Model arguments they set.
MODEL_KEYS = {"dModel": "d", "heads": "heads", "encoderLayers": "enc_layers",
              "decoderLayers": "dec_layers", "ffnDim": "ffn"}


def model_sizes(config):
    """The sizes in the `model:` section of a ferrotrain config (two-space-indented integer
    keys), so that the baseline builds the model the config trains."""
    sizes, in_model = {}, False
    with open(config, encoding="utf-8") as f:
        for line in f:
            if re.match(r"^\S", line):
                in_model = line.startswith("model:")
            m = re.match(r"^  (\w+): (\d+)\s*(#.*)?$", line)
            if in_model and m and m.group(1) in MODEL_KEYS:
                sizes[MODEL_KEYS[m.group(1)]] = int(m.group(2))
    return sizes


def batches(pairs, max_tokens, seed):
    rng = random.Random(seed)
    idx = list(range(len(pairs)))
    rng.shuffle(idx)
    out = []
    for c in range(0, len(idx), 100 * 64):
        chunk = sorted(idx[c:c + 100 * 64], key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
        cur, ls, lt = [], 0, 0
        for i in chunk:
            s, t = len(pairs[i][0]) + 2, len(pairs[i][1]) + 2
            if cur and ((len(cur) + 1) * max(ls, s) > max_tokens or (len(cur) + 1) * max(lt, t) > max_tokens):
                out.append(cur)
                cur, ls, lt = [], 0, 0
            cur.append(i)
            ls, lt = max(ls, s), max(lt, t)
        if cur:
            out.append(cur)
    rng.shuffle(out)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data/multi30k")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--config", help="a ferrotrain config whose model: sizes to build "
                                     "(default: d_model 256, 4 heads, 3+3 layers, ffn 512)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup-steps", type=int, default=10, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--bf16", action="store_true",
                    help="torch.autocast(bfloat16) around forward and loss")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (fused AdamW on cuda)")
    ap.add_argument("--cudnn-sdp", action="store_true",
                    help="leave cuDNN attention on (PyTorch's default on Hopper; it compiles a "
                         "graph per batch shape, so by default it is off, as in ferrotrain)")
    ap.add_argument("--phases", action="store_true",
                    help="print one line a step with the milliseconds of each phase (data, "
                         "forward, loss = output projection and loss forward and backward, "
                         "backward, optimizer), as FERROTRAIN_PHASE_TIMES=1 does (bench/profile.sh)")
    ap.add_argument("--torch-profile", metavar="FILE",
                    help="write torch.profiler's ops table (key_averages, by self CPU time) of "
                         "the timed steps to FILE")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(args.cudnn_sdp)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    tok = Tokenizer.from_file(args.tokenizer)
    en, de = read(f"{args.data}/train.en.gz"), read(f"{args.data}/train.de.gz")
    pairs = [(tok.encode(s).ids, tok.encode(t).ids) for s, t in zip(en, de)]
    pairs = [p for p in pairs if 0 < len(p[0]) <= 100 and 0 < len(p[1]) <= 100]
    sizes = model_sizes(args.config) if args.config else {}
    model = Model(tok.get_vocab_size(), **sizes).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01,
                            fused=device.type == "cuda")
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1, reduction="sum")
    plan = batches(pairs, args.max_tokens, 1)
    tokens = 0
    start = None
    profiler = None
    for step, b in enumerate(plan[: args.steps + args.warmup_steps], 1):
        if step == args.warmup_steps + 1:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0
            if args.torch_profile:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                profiler.__enter__()
        t0 = time.perf_counter()
        ls = max(len(pairs[i][0]) for i in b) + 1
        lt = max(len(pairs[i][1]) for i in b) + 1
        src = torch.tensor([pairs[i][0] + [EOS] + [PAD] * (ls - len(pairs[i][0]) - 1) for i in b])
        tin = torch.tensor([[BOS] + pairs[i][1] + [PAD] * (lt - len(pairs[i][1]) - 1) for i in b])
        tout = torch.tensor([pairs[i][1] + [EOS] + [PAD] * (lt - len(pairs[i][1]) - 1) for i in b])
        ntgt = int(tout.ne(PAD).sum())
        src, tin, tout = src.to(device), tin.to(device), tout.to(device)
        for g in opt.param_groups:
            g["lr"] = 2e-3 * min(step / 300, math.sqrt(300 / step))
        if args.phases:
            # The same computation, cut where ferrotrain's phases are: the decoder's states,
            # then the output projection and loss differentiated on their own, then the rest
            # of backward from the states' gradient.
            marks = [("data", time.perf_counter())]
            opt.zero_grad()
            marks.append(("optimizer", time.perf_counter()))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                h = model.states(src, tin)
            marks.append(("forward", time.perf_counter()))
            hd = h.detach().requires_grad_()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                logits = hd @ model.embed.weight.t()
                loss = loss_fn(logits.view(-1, logits.size(-1)).float(), tout.view(-1)) / ntgt
            loss.backward()
            marks.append(("loss", time.perf_counter()))
            h.backward(hd.grad)
            marks.append(("backward", time.perf_counter()))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_value = loss.item()
            marks.append(("optimizer", time.perf_counter()))
            spent, last = {}, t0
            for name, t in marks:
                spent[name] = spent.get(name, 0.0) + (t - last) * 1e3
                last = t
            real = int(tout.ne(PAD).sum())
            ntok = sum(len(pairs[i][0]) + len(pairs[i][1]) + 2 for i in b)
            print(f"phases step={step} src={len(b)}x{ls} tgt={len(b)}x{lt} real={real} tokens={ntok} "
                  + " ".join(f"{k}={v:.2f}" for k, v in spent.items())
                  + f" total={(last - t0) * 1e3:.2f}", flush=True)
        else:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                logits = model(src, tin)
                loss = loss_fn(logits.view(-1, logits.size(-1)).float(), tout.view(-1)) / ntgt
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        tokens += sum(len(pairs[i][0]) + len(pairs[i][1]) + 2 for i in b)
    if profiler is not None:
        profiler.__exit__(None, None, None)
        with open(args.torch_profile, "w", encoding="utf-8") as f:
            f.write(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=60,
                                                  max_name_column_width=60))
    if device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - start
    shape = ",".join(f"{k}={v}" for k, v in sizes.items()) or "default"
    print(f"pytorch {torch.__version__} {device.type} threads={args.threads} bf16={args.bf16} model={shape} "
          f"cudnn_sdp={device.type == 'cuda' and args.cudnn_sdp} "
          f"max_tokens={args.max_tokens}: {args.steps} steps in {secs:.1f}s = "
          f"{args.steps / secs:.2f} steps/s, {tokens / secs:.0f} tokens/s (source+target, with BOS/EOS), loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
