"""Reference AdamW trajectory for trainer/src/optim.rs::adamw_matches_pytorch.

Run with PyTorch 2.11.0 on CPU:  python scripts/reference/adamw_reference.py
It prints the parameters after three steps of torch.optim.AdamW on fixed gradients, in
float64; the Rust test hard-codes them.
"""
import torch

torch.set_default_dtype(torch.float64)
w = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
b = torch.tensor([0.25], requires_grad=True)
# Weight decay applies to the weight only (the trainer does not decay biases/norms).
opt = torch.optim.AdamW(
    [{"params": [w], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}],
    lr=0.1, betas=(0.9, 0.98), eps=1e-9, foreach=False,
)
grads_w = [[0.1, -0.2, 0.3], [0.05, 0.1, -0.4], [-0.3, 0.2, 0.1]]
grads_b = [0.5, -0.25, 0.125]
for i, lr in enumerate([0.1, 0.05, 0.02]):
    for group in opt.param_groups:
        group["lr"] = lr
    w.grad = torch.tensor(grads_w[i])
    b.grad = torch.tensor([grads_b[i]])
    opt.step()
print("torch", torch.__version__)
print("REFERENCE_W", [repr(x) for x in w.detach().tolist()])
print("REFERENCE_B", [repr(x) for x in b.detach().tolist()])
