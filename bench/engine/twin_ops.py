"""The eager-PyTorch twin's building blocks (bench/engine/twin.py): the policy parser, the
autograd functions that keep what the engine's own kernels keep (RMSNorm, the vocab cross-entropy,
the grouped GEMM) and the two checkpoints (Megatron's CheckpointFunction through
torch.utils.checkpoint, and an output-discarding checkpoint like CheckpointWithoutOutput).
"""

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

NORM_EPS = 1e-5


# ---------------------------------------------------------------------------------------------
# Policies


def parse_policy(text):
    text = text.strip()
    if text == "none":
        text = "selective:[]"
    if text.startswith("selective:["):
        labels = [x.strip() for x in text[len("selective:["):-1].split(",") if x.strip()]
        return {"full": None, "labels": set(labels)}
    _, method, n = text.split(":")
    return {"full": (method, int(n)), "labels": set()}


# ---------------------------------------------------------------------------------------------
# Autograd pieces (mirroring engine/ops.cc)


class RmsNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(eps))
        y = (xf * rstd).mul_(weight.float()).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        dy = grad.float()
        grad_weight = (dy * xhat).reshape(-1, x.size(-1)).sum(0).to(weight.dtype)
        dxhat = dy * weight.float()
        dot = (dxhat * xhat).mean(-1, keepdim=True)
        grad_x = dxhat.sub_(xhat.mul_(dot)).mul_(rstd).to(x.dtype)
        return grad_x, grad_weight, None


class CrossEntropyFn(torch.autograd.Function):
    """Megatron's vocab_parallel_cross_entropy on one rank: keeps the fp32 softmax."""

    @staticmethod
    def forward(ctx, logits, target):
        ctx.dtype = logits.dtype
        x = logits.float()
        logits_max = x.max(-1)[0]
        x.sub_(logits_max.unsqueeze(-1))
        predicted = x.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        x.exp_()
        sum_exp = x.sum(-1)
        loss = torch.log(sum_exp).sub_(predicted)
        x.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(x, target)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, target = ctx.saved_tensors
        ones = torch.ones(target.shape, dtype=softmax.dtype, device=softmax.device).unsqueeze(-1)
        softmax.scatter_add_(-1, target.unsqueeze(-1), ones.neg())
        softmax.mul_(grad.unsqueeze(-1))
        return softmax.to(ctx.dtype), None


class GroupedGemmFn(torch.autograd.Function):
    """One autograd node over all experts: x [tokens, k] sorted by expert, w [experts, k, n]."""

    @staticmethod
    def forward(ctx, x, w, counts):
        ctx.save_for_backward(x, w)
        ctx.counts = counts
        out = torch.empty(x.size(0), w.size(2), dtype=x.dtype, device=x.device)
        off = 0
        for e, n in enumerate(counts):
            if n:
                torch.mm(x[off:off + n], w[e], out=out[off:off + n])
                off += n
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros_like(w)
        off = 0
        for e, n in enumerate(ctx.counts):
            if n:
                g = grad[off:off + n]
                torch.mm(g, w[e].t(), out=grad_x[off:off + n])
                torch.mm(x[off:off + n].t(), g, out=grad_w[e])
                off += n
        return grad_x, grad_w, None


def checkpoint(fn, *args):
    """Megatron's tensor_parallel.checkpoint: reentrant, inputs kept, RNG state restored."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True)


class _DiscardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, owner, *args):
        with torch.no_grad():
            outputs = run_function(*args)
        owner.inputs = args
        owner.ctx = ctx
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        owner = ctx.owner
        if owner.replayed is None:
            owner.replay()
        outs, leaves = owner.replayed
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        owner.replayed = None
        owner.ctx = ctx.owner = None  # break the owner <-> ctx cycle now, not at the next GC
        return (None, None) + tuple(x.grad if x.requires_grad else None for x in leaves)


class OutputDiscardingCheckpoint:
    """Megatron's CheckpointWithoutOutput."""

    def __init__(self):
        self.replayed = None

    def run(self, fn, *args):
        self.fn = fn
        self.rng = (torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None)
        outputs = _DiscardFn.apply(fn, self, *args)
        self.ctx.owner = self
        self.outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return outputs

    def discard(self, hook_tensor):
        for o in self.outputs:
            storage_of(o).resize_(0)
        if hook_tensor.requires_grad:
            hook_tensor.register_hook(lambda _grad: self.replay())
        else:
            self.outputs = None
            self.inputs = None

    def replay(self):
        if self.replayed is not None or self.outputs is None:
            return
        leaves = tuple(x.detach().requires_grad_(x.requires_grad) for x in self.inputs)
        cpu, cuda = torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None
        torch.set_rng_state(self.rng[0])
        if self.rng[1] is not None:
            torch.cuda.set_rng_state(self.rng[1])
        with torch.enable_grad():
            outs = self.fn(*leaves)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)
        outs = outs if isinstance(outs, tuple) else (outs,)
        with torch.no_grad():
            for old, new in zip(self.outputs, outs):
                storage = storage_of(old)
                storage.resize_(storage_of(new).nbytes())
                storage.copy_(storage_of(new))
                # The replay's roots need their graph, not their data: free the second copy.
                storage_of(new).resize_(0)
        self.replayed = (outs, leaves)
        self.outputs = None
        self.inputs = None


def storage_of(t):
    """The tensor's untyped storage (LibTorch 1.13's Python spells it differently)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


def dropout(x, p):
    return F.dropout(x, p, training=True) if p > 0 else x


# ---------------------------------------------------------------------------------------------
# The model (mirroring engine/model.cc)
