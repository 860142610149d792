"""Where a training step's time goes, ferrotrain against PyTorch eager (bench/profile.sh runs
this with the PyTorch venv's python; see bench/README.md). Named step_profile, not profile:
bench/ is on pytorch_transformer.py's path, and `profile` is a standard module.

For each precision: ferrotrain's per-phase step times (FERROTRAIN_PHASE_TIMES=1) and the same
phases of bench/pytorch_transformer.py --phases, both with `perf record` attached after the
warm-up steps (CPU time by library and symbol, grouped: GEMM kernels, attention, other ATen
kernels, allocator, kernel, OpenMP waits, the Rust binary, the Python interpreter); the
step's matmul FLOPs counted from each step's batch shape; and this machine's matmul FLOP/s at
the recipe's GEMM shapes (torch.mm, the same oneDNN/MKL as libtorch), so that each side's
achieved FLOP/s is a fraction of what the machine does on those shapes.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from pytorch_transformer import model_sizes  # the baseline's reading of the config's model:

PHASES = ["data", "forward", "loss", "backward", "optimizer", "other"]
PHASE_NAMES = {
    "data": "data / batching",
    "forward": "forward (to the decoder's states)",
    "loss": "output projection + loss, fwd+bwd",
    "backward": "backward (rest of the network)",
    "optimizer": "optimizer (zero, grad norm, clip, AdamW)",
    "other": "other (logging, bookkeeping)",
}


def vocab_size(tokenizer):
    with open(tokenizer, encoding="utf-8") as f:
        return len(json.load(f)["model"]["vocab"])


def step_flops(m, shapes, real):
    """Matmul FLOPs of one training step (forward x 3: backward takes two matmuls for each
    of the forward's) for micro-batches `shapes` [(B, Ls, Lt)] and `real` scored target
    tokens: every linear layer on the padded tokens, attention scores and values over full
    (not causally halved) squares, the output projection on the scored tokens only."""
    d, f, enc, dec = m["d"], m["ffn"], m["enc_layers"], m["dec_layers"]
    fwd = 0
    for b, ls, lt in shapes:
        s, t = b * ls, b * lt
        fwd += enc * (2 * s * d * (3 * d + d + 2 * f) + 4 * b * ls * ls * d)
        fwd += dec * (2 * t * d * (3 * d + d + d + d + 2 * f) + 2 * s * d * 2 * d
                      + 4 * b * lt * lt * d + 4 * b * lt * ls * d)
    fwd += 2 * real * d * m["vocab"]
    return 3 * fwd


def parse_phases(text, warmup):
    steps = []
    for line in text.splitlines():
        if not line.startswith("phases "):
            continue
        kv = dict(x.split("=", 1) for x in line.split()[1:])
        if int(kv["step"]) <= warmup:
            continue
        shapes = []
        for s, t in zip(kv["src"].split("+"), kv["tgt"].split("+")):
            b, ls = map(int, s.split("x"))
            lt = int(t.split("x")[1])
            shapes.append((b, ls, lt))
        ms = {p: float(kv.get(p, 0.0)) for p in PHASES}
        ms["total"] = float(kv["total"])
        steps.append({"shapes": shapes, "real": int(kv["real"]), "tokens": int(kv["tokens"]),
                      "ms": ms})
    # The last step's `other` is the run's final checkpoint: not a step's work.
    return steps[:-1]


def run_with_perf(cmd, env, perf_out, warmup, log_path):
    """Runs `cmd`, attaching `perf record` to it once it printed the phases line of step
    `warmup` (so start-up and warm-up stay out of the profile); returns its output."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines, perf = [], None
    for line in proc.stdout:
        lines.append(line)
        if perf is None and perf_out and line.startswith(f"phases step={warmup} "):
            perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "499",
                                     "-p", str(proc.pid), "-o", perf_out],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.wait()
    if perf is not None:
        perf.wait()
    with open(log_path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}); its output: {log_path}")
    return "".join(lines)


CATEGORIES = [
    ("GEMM (oneDNN JIT, MKL/oneDNN gemm)", lambda dso, sym: dso.startswith("[JIT]")
     or re.search(r"gemm|brgemm|dnnl|mkldnn|jit_|_blas_|cblas", sym)),
    ("attention (fused SDPA kernel)", lambda dso, sym: "flash_attention" in sym),
    ("allocator (malloc/free)", lambda dso, sym: "jemalloc" in dso or re.search(
        r"(^|[^a-z_])(malloc|free|calloc|realloc|cfree|posix_memalign)($|[^a-z_])|_rjem_|je_|"
        r"_int_malloc|_int_free|tcache|operator new|operator delete|Jemalloc|"
        r"alloc_cpu|CPUAllocator|free_cpu", sym)),
    ("kernel: page faults, zeroing", lambda dso, sym: dso == "[kernel.kallsyms]" and re.search(
        r"fault|clear_page|page|folio|mm_|lru|pte|pmd|vma|zap|memcg|rmqueue", sym)),
    ("kernel: other (scheduler, syscalls)", lambda dso, sym: dso == "[kernel.kallsyms]"),
    ("OpenMP wait/spin (libgomp)", lambda dso, sym: "gomp" in dso or "gomp_" in sym),
    ("ATen kernels: elementwise, reductions, copies", lambda dso, sym: (
        "libtorch_cpu" in dso or "libm" in dso or "libc.so" in dso) and re.search(
        r"native::|vml|Sleef|at::vec|Vectorized|cpu_kernel|copy_kernel|loop_2d|Moments|"
        r"softmax|LayerNorm|random|bernoulli|Generator|reduce|_sum|memmove|memcpy|memset|"
        r"exp|log", sym)),
    ("Python interpreter", lambda dso, sym: re.search(r"python|libpython", dso)),
    ("torch's Python bindings (torch/_C)", lambda dso, sym: "libtorch_python" in dso
     or "_C.cpython" in dso),
    ("ferrotrain's own code (Rust)", lambda dso, sym: dso.startswith("ferrotrain")),
    ("dispatch, autograd, tensor bookkeeping (libtorch, c10)", lambda dso, sym:
     re.search(r"libtorch|libc10|libstdc\+\+|libc\.so|ld-linux", dso)),
]


def perf_shares(path):
    if not os.path.exists(path):
        return {}
    out = subprocess.run(["perf", "report", "-i", path, "--sort", "dso,sym", "--stdio", "-q",
                          "--percent-limit", "0"], capture_output=True, text=True).stdout
    shares = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+(?: tid \d+)?)\s+\[[.k]\]\s+(.*)$", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        name = next((n for n, test in CATEGORIES if test(dso, sym)), "other")
        shares[name] = shares.get(name, 0.0) + pct
    return shares


def gemm_shapes(m, tokens=2000, real=1750):
    d, f, v = m["d"], m["ffn"], m["vocab"]
    shapes = set()
    for rows, k, n in [(tokens, d, 3 * d), (tokens, d, d), (tokens, d, 2 * d), (tokens, d, f),
                       (tokens, f, d), (real, d, v)]:
        shapes |= {(rows, k, n), (rows, n, k), (n, rows, k)}  # y = xW, dx = dy W^T, dW = dy^T x
    return sorted(shapes)


def measure_peak(m, threads):
    import torch
    torch.set_num_threads(threads)
    result = {}
    for prec, kind in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
        rows = []
        for (a, k, n) in gemm_shapes(m):
            x, w = torch.randn(a, k, dtype=kind), torch.randn(k, n, dtype=kind)
            for _ in range(3):
                torch.mm(x, w)
            # The best of 5 rounds of >= 50 ms each: other processes only ever slow it down.
            secs = float("inf")
            for _ in range(5):
                reps, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 0.05:
                    torch.mm(x, w)
                    reps += 1
                secs = min(secs, (time.perf_counter() - t0) / reps)
            rows.append(((a, k, n), 2 * a * k * n / secs, 2 * a * k * n))
        best = max(r[1] for r in rows)
        # The machine's speed over the whole set of shapes, each as often as a step has it.
        total_flops = sum(r[2] for r in rows)
        mix = total_flops / sum(r[2] / r[1] for r in rows)
        result[prec] = {"best": best, "mix": mix,
                        "shapes": [(f"{a}x{k}x{n}", fl / 1e9) for (a, k, n), fl, _ in rows]}
    return result


def summarize(steps):
    n = len(steps)
    mean = {p: sum(s["ms"][p] for s in steps) / n for p in PHASES + ["total"]}
    return mean


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferrotrain", required=True, help="the ferrotrain binary")
    ap.add_argument("--runs", required=True, help="directory with <precision>.yaml configs")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--config", required=True, help="the recipe (model sizes)")
    ap.add_argument("--steps", type=int, default=70)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--no-perf", action="store_true")
    ap.add_argument("--no-torch-profile", action="store_true")
    args = ap.parse_args()
    m = model_sizes(args.config)
    m["vocab"] = vocab_size(args.tokenizer)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    out = args.runs
    report = []
    say = lambda s="": (print(s, flush=True), report.append(s))
    load = lambda: open("/proc/loadavg").read().split()[:3]
    say(f"model d={m['d']} heads={m['heads']} layers={m['enc_layers']}+{m['dec_layers']} ffn={m['ffn']} "
        f"vocab={m['vocab']}; {args.threads} threads; OMP_WAIT_POLICY="
        f"{env.get('OMP_WAIT_POLICY', '(unset)')}; steps {args.warmup + 1}-{args.steps} timed; "
        f"load average at start {' '.join(load())}")
    peak = measure_peak(m, args.threads)
    results = {}
    for prec in args.precisions.split(","):
        perf_ours = None if args.no_perf else f"{out}/perf-ferrotrain-{prec}.data"
        perf_theirs = None if args.no_perf else f"{out}/perf-pytorch-{prec}.data"
        job = f"{out}/job-{prec}"
        subprocess.run(["rm", "-rf", job])
        os.makedirs(job)
        subprocess.run(["cp", args.tokenizer, f"{job}/tokenizer.json"])
        ours_env = dict(env, FERROTRAIN_PHASE_TIMES="1")
        ours = run_with_perf([args.ferrotrain, "run", "--config", f"{out}/{prec}.yaml",
                              "--checkpoint-dir", out, "--job", f"job-{prec}"],
                             ours_env, perf_ours, args.warmup, f"{out}/ferrotrain-{prec}.log")
        py = [sys.executable, f"{here}/pytorch_transformer.py", "--config", args.config,
              "--tokenizer", args.tokenizer, "--threads", str(args.threads),
              "--steps", str(args.steps - args.warmup), "--warmup-steps", str(args.warmup),
              "--phases"] + (["--bf16"] if prec == "bf16" else [])
        theirs = run_with_perf(py, env, perf_theirs, args.warmup, f"{out}/pytorch-{prec}.log")
        if not args.no_torch_profile:
            subprocess.run(py[:-1] + ["--steps", "10", "--warmup-steps", "5", "--torch-profile",
                                      f"{out}/torch-ops-{prec}.txt"]
                           + (["--bf16"] if prec == "bf16" else []),
                           env=env, capture_output=True)
        results[prec] = {}
        for side, text, perf in [("ferrotrain", ours, perf_ours), ("PyTorch", theirs, perf_theirs)]:
            steps = parse_phases(text, args.warmup)
            flops = sum(step_flops(m, s["shapes"], s["real"]) for s in steps)
            secs = sum(s["ms"]["total"] for s in steps) / 1e3
            tokens = sum(s["tokens"] for s in steps)
            results[prec][side] = {
                "ms": summarize(steps), "steps": len(steps), "flops_per_s": flops / secs,
                "flops_per_step": flops / len(steps), "tokens_per_s": tokens / secs,
                "tokens_per_step": tokens / len(steps), "perf": perf_shares(perf) if perf else {},
            }
    say(f"load average at end {' '.join(load())}")
    for prec, sides in results.items():
        a, b = sides["ferrotrain"], sides["PyTorch"]
        say()
        say(f"## {prec}: mean ms per step (steps {args.warmup + 1}-{args.steps - 1}; each side its "
            f"own batches of <= 2000 padded tokens)")
        say()
        say("| phase | ferrotrain ms | PyTorch ms |")
        say("|---|---|---|")
        for p in PHASES + ["total"]:
            name = PHASE_NAMES.get(p, "**step**")
            say(f"| {name} | {a['ms'][p]:.1f} | {b['ms'][p]:.1f} |")
        say(f"| tokens per step (source+target, with EOS) | {a['tokens_per_step']:.0f} | "
            f"{b['tokens_per_step']:.0f} |")
        say(f"| tokens/s | {a['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} "
            f"(ferrotrain {a['tokens_per_s'] / b['tokens_per_s']:.2f}x) |")
        pk = peak[prec]
        for side, r in [("ferrotrain", a), ("PyTorch", b)]:
            say(f"| {side}: matmul GFLOP per step, achieved GFLOP/s | "
                f"{r['flops_per_step'] / 1e9:.1f} GFLOP, {r['flops_per_s'] / 1e9:.1f} GFLOP/s | "
                f"{100 * r['flops_per_s'] / pk['best']:.0f}% of the best GEMM "
                f"({pk['best'] / 1e9:.0f} GFLOP/s), {100 * r['flops_per_s'] / pk['mix']:.0f}% of "
                f"the recipe's GEMM mix ({pk['mix'] / 1e9:.0f} GFLOP/s) |")
        say()
        cats = sorted(set(a["perf"]) | set(b["perf"]),
                      key=lambda c: -(a["perf"].get(c, 0) + b["perf"].get(c, 0)))
        if cats:
            say("| CPU time (perf, both threads) | ferrotrain % | PyTorch % |")
            say("|---|---|---|")
            for c in cats:
                say(f"| {c} | {a['perf'].get(c, 0):.1f} | {b['perf'].get(c, 0):.1f} |")
    say()
    say("matmul GFLOP/s on this machine at the recipe's GEMM shapes (rows x inner x cols, "
        f"torch.mm, {args.threads} threads):")
    for prec, pk in peak.items():
        say(f"  {prec}: best {pk['best'] / 1e9:.0f}, step mix {pk['mix'] / 1e9:.0f}; " +
            ", ".join(f"{s} {g:.0f}" for s, g in pk["shapes"]))
    with open(f"{out}/profile.md", "w", encoding="utf-8") as f:
        f.write("\n".join(report) + "\n")
    print(f"\n(tables: {out}/profile.md; logs, perf data, torch.profiler ops tables: {out}/)")


if __name__ == "__main__":
    main()
