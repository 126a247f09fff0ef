#!/usr/bin/python3
"""Expected optimizer trajectories from PyTorch, for loom's optimizer conformance test.

Writes OUT_DIR/index.json and OUT_DIR/data.bin (little-endian float32). For each case: random
parameters, a sequence of gradients (some parameters without a gradient at some steps, some
without weight decay), a learning rate per step, the parameters PyTorch holds after every step
and its optimizer state after the last one. AdamW, SGD and RMSprop are torch.optim.AdamW,
torch.optim.SGD and torch.optim.RMSprop (RMSprop is not one of loom's optimizers: its cases are
what the out-of-tree example sdk/examples/rmsprop is checked against); Lion is the update rule
of Chen et al. (2023), Algorithm 2, written below with torch operations. Nothing here runs loom.

When torch cannot be imported, index.json says why ({"skipped": "..."}) and the script still
exits 0, so that the build goes on and the test reports the skip.

Usage: torch_reference.py OUT_DIR
"""

import json
import os
import struct
import sys

STEPS = 10

# name, shape, weight decay on. Odd sizes; the last parameter is large enough to be split into
# several parallel chunks by the optimizers (32 Ki elements per chunk).
PARAMETERS = [
    ("h.0.attn.c_attn.weight", [37, 19], True),
    ("h.0.attn.c_attn.bias", [19], False),
    ("h.0.mlp.c_fc.weight", [3, 5, 7], True),
    ("ln_f.weight", [1], False),
    ("wte.weight", [101, 693], True),
]


def lion_step(params, grads, moments, lr, beta1, beta2, weight_decays):
    """One Lion update, Chen et al. (2023), Algorithm 2, in float32 torch operations."""
    import torch

    for p, g, m, wd in zip(params, grads, moments, weight_decays):
        if g is None:
            continue
        c = m * beta1 + g * (1.0 - beta1)
        p.sub_(lr * (torch.sign(c) + wd * p))
        m.mul_(beta2).add_(g, alpha=1.0 - beta2)


# ---- Muon: Keller Jordan's muon.py (github.com/KellerJordan/Muon), transcribed ----
# Differences, all on purpose: float32 instead of bfloat16 in the iteration; the scale reads the
# shape of the matrix as flattened (rows = shape[0]); the step count of the auxiliary Adam is the
# global one, as loom's trainer passes it; parameters without a gradient are skipped.


def zeropower_via_newtonschulz5(G, steps):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.float()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def muon_update(grad, momentum, beta, ns_steps, nesterov, moonlight):
    momentum.lerp_(grad, 1 - beta)
    update = grad.lerp_(momentum, beta) if nesterov else momentum
    update = update.reshape(len(update), -1)
    update = zeropower_via_newtonschulz5(update, steps=ns_steps)
    if moonlight:
        update *= 0.2 * max(update.size(-2), update.size(-1)) ** 0.5
    else:
        update *= max(1, update.size(-2) / update.size(-1)) ** 0.5
    return update


def adam_update(grad, buf1, buf2, step, betas, eps):
    buf1.lerp_(grad, 1 - betas[0])
    buf2.lerp_(grad.square(), 1 - betas[1])
    buf1c = buf1 / (1 - betas[0] ** step)
    buf2c = buf2 / (1 - betas[1] ** step)
    return buf1c / (buf2c.sqrt() + eps)


def muon_step(params, grads, state, lr, step, o, decays):
    """MuonWithAuxAdam.step for one step: matrices (2-D and up) by Muon, the rest by Adam."""
    for p, g, st, decay in zip(params, grads, state, decays):
        if g is None:
            continue
        wd = o["weight_decay"] if decay else 0.0
        if p.ndim >= 2:
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch_zeros_like(p)
            update = muon_update(g.clone(), st["momentum_buffer"], o["momentum"], int(o["ns_steps"]),
                                 o["nesterov"], o["moonlight_scaling"])
            p.mul_(1 - lr * wd)
            p.add_(update.reshape(p.shape), alpha=-lr)
        else:
            alr = lr * o["adam_lr_scale"]
            if "exp_avg" not in st:
                st["exp_avg"] = torch_zeros_like(p)
                st["exp_avg_sq"] = torch_zeros_like(p)
            update = adam_update(g, st["exp_avg"], st["exp_avg_sq"], step + 1, (o["beta1"], o["beta2"]),
                                 o["epsilon"])
            p.mul_(1 - alr * wd)
            p.add_(update, alpha=-alr)


def torch_zeros_like(p):
    import torch

    return torch.zeros_like(p)


# ---- Adafactor: Shazeer & Stern (2018) as Hugging Face's transformers.optimization.Adafactor
# writes it (torch 1.13 has none), transcribed; the step count is the global one and weight decay
# follows the mask.


def adafactor_rms(tensor):
    return tensor.norm(2) / (tensor.numel() ** 0.5)


def adafactor_approx_sq_grad(exp_avg_sq_row, exp_avg_sq_col):
    r_factor = (exp_avg_sq_row / exp_avg_sq_row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    c_factor = exp_avg_sq_col.unsqueeze(-2).rsqrt()
    return torch_mul(r_factor, c_factor)


def torch_mul(a, b):
    import torch

    return torch.mul(a, b)


def adafactor_step(params, grads, state, lr, step, o, decays):
    import math

    t = step + 1
    for p, grad, st, decay in zip(params, grads, state, decays):
        if grad is None:
            continue
        factored = grad.ndim >= 2
        use_first_moment = o["beta1"] is not None
        if not st:
            if use_first_moment:
                st["exp_avg"] = torch_zeros_like(grad)
            if factored:
                st["exp_avg_sq_row"] = torch_zeros_like(grad.mean(dim=-1))
                st["exp_avg_sq_col"] = torch_zeros_like(grad.mean(dim=-2))
            else:
                st["exp_avg_sq"] = torch_zeros_like(grad)
        rms = adafactor_rms(p)
        rel_step_sz = lr
        if o["relative_step"]:
            min_step = 1e-6 * t if o["warmup_init"] else 1e-2
            rel_step_sz = min(min_step, 1.0 / math.sqrt(t))
        param_scale = max(o["epsilon2"], float(rms)) if o["scale_parameter"] else 1.0
        step_lr = param_scale * rel_step_sz
        beta2t = 1.0 - math.pow(t, o["decay_rate"])
        update = (grad ** 2) + o["epsilon1"]
        if factored:
            st["exp_avg_sq_row"].mul_(beta2t).add_(update.mean(dim=-1), alpha=(1.0 - beta2t))
            st["exp_avg_sq_col"].mul_(beta2t).add_(update.mean(dim=-2), alpha=(1.0 - beta2t))
            update = adafactor_approx_sq_grad(st["exp_avg_sq_row"], st["exp_avg_sq_col"])
            update.mul_(grad)
        else:
            st["exp_avg_sq"].mul_(beta2t).add_(update, alpha=(1.0 - beta2t))
            update = st["exp_avg_sq"].rsqrt().mul_(grad)
        update.div_((adafactor_rms(update) / o["clip_threshold"]).clamp_(min=1.0))
        update.mul_(step_lr)
        if use_first_moment:
            st["exp_avg"].mul_(o["beta1"]).add_(update, alpha=(1 - o["beta1"]))
            update = st["exp_avg"]
        if decay and o["weight_decay"] != 0:
            p.add_(p, alpha=(-o["weight_decay"] * step_lr))
        p.add_(-update)


# ---- SOAP: the authors' soap.py (github.com/nikhilvyas/SOAP: project, project_back,
# update_preconditioner, get_orthogonal_matrix, get_orthogonal_matrix_QR, merge_dims,
# precondition_1d), transcribed, with Levanter's blocks (block_size: each block of the working
# shape is one SOAP of its own; Levanter pads the last blocks, loom and this transcription do not).
# Differences, on purpose: a tensor that merge_dims makes one dimension is a vector (preconditioned
# only under precondition_1d; the authors' code gives it an n x n preconditioner, prohibitive on a
# CPU for n in the thousands); eigh and QR in float64 (rounded to float32), and each basis column's
# sign fixed (largest entry positive), which SOAP's update does not depend on but its state does;
# weight decay follows the mask; the step lives in a tensor, 0 until the preconditioner is set up.


def soap_canonical(q):
    idx = q.abs().argmax(dim=0)
    signs = torch_sign(q[idx, torch_arange(q.shape[1])])
    return q * signs.unsqueeze(0)


def torch_sign(x):
    import torch

    return torch.where(x < 0, -torch.ones_like(x), torch.ones_like(x))


def torch_arange(n):
    import torch

    return torch.arange(n)


def soap_project(grad, Q):
    for mat in Q:
        if mat is not None:
            grad = torch_tensordot(grad, mat, [[0], [0]])
        else:
            grad = grad.permute(list(range(1, grad.ndim)) + [0])
    return grad


def soap_project_back(grad, Q):
    for mat in Q:
        if mat is not None:
            grad = torch_tensordot(grad, mat, [[0], [1]])
        else:
            grad = grad.permute(list(range(1, grad.ndim)) + [0])
    return grad


def torch_tensordot(a, b, dims):
    import torch

    return torch.tensordot(a, b, dims=dims)


def soap_eigenbasis(m):
    import torch

    md = m.double() + 1e-30 * torch.eye(m.shape[0], dtype=torch.float64)
    _, Q = torch.linalg.eigh(md)
    Q = torch.flip(Q, [1])
    return soap_canonical(Q).float()


def soap_refresh(st, o_):
    """get_orthogonal_matrix_QR."""
    import torch

    final = []
    exp_avg_sq = st["exp_avg_sq2d"]
    for ind, (m, o) in enumerate(zip(st["GG"], st["Q"])):
        if m is None:
            final.append(None)
            continue
        md, od = m.double(), o.double()
        est_eig = torch.diag(od.T @ md @ od)
        sort_idx = torch.argsort(est_eig, descending=True)
        exp_avg_sq = exp_avg_sq.index_select(ind, sort_idx)
        od = od[:, sort_idx]
        power_iter = md @ od
        Q, _ = torch.linalg.qr(power_iter)
        final.append(soap_canonical(Q).float())
    st["exp_avg_sq2d"] = exp_avg_sq
    return final


def soap_merge_dims(shape, max_dim):
    """The authors' merge_dims, on a shape."""
    new_shape, curr = [], 1
    for sh in shape:
        if curr * sh > max_dim:
            if curr > 1:
                new_shape.append(curr)
                curr = sh
            else:
                new_shape.append(sh)
                curr = 1
        else:
            curr *= sh
    if curr > 1 or len(new_shape) == 0:
        new_shape.append(curr)
    return new_shape


def soap_plan(shape, o):
    """The working shape, which of its dimensions are preconditioned, and its blocks (tuples of
    slices, row-major)."""
    import itertools

    max_dim = o["max_precond_dim"]
    if len(shape) <= 1:
        dims = [int(shape[0]) if len(shape) else 1]
        pre = [bool(o.get("precondition_1d", False)) and dims[0] <= max_dim]
    else:
        dims = soap_merge_dims(list(shape), max_dim) if o.get("merge_dims", False) else list(shape)
        if len(dims) == 1:  # merged into one dimension: a vector (loom's rule; the authors' gives it a preconditioner)
            pre = [bool(o.get("precondition_1d", False)) and dims[0] <= max_dim]
        else:
            pre = [d <= max_dim for d in dims]
    bs = o.get("block_size")
    cuts, sides = [], []
    for d, p in zip(dims, pre):
        step = int(bs) if (bs and p and d > bs) else d
        sides.append(step)
        cuts.append([slice(i, min(i + step, d)) for i in range(0, d, step)])
    return dims, pre, sides, list(itertools.product(*cuts))


def soap_block_update(g, st, o, shampoo_beta, pre):
    """One SOAP update of one block (the authors' step for one parameter); returns the direction
    (before the step size) or None on the block's first gradient."""
    import torch

    if not st:
        st["exp_avg2d"] = torch.zeros_like(g)
        st["exp_avg_sq2d"] = torch.zeros_like(g)
        st["GG"] = [torch.zeros(sh, sh) if p else None for sh, p in zip(g.shape, pre)]
        st["Q"] = None
        st["step"] = 0
        soap_update_preconditioner(g, st, shampoo_beta, o)
        return None
    grad_projected = soap_project(g, st["Q"])
    exp_avg, exp_avg_sq = st["exp_avg2d"], st["exp_avg_sq2d"]
    beta1, beta2 = o["beta1"], o["beta2"]
    st["step"] += 1
    exp_avg.mul_(beta1).add_(grad_projected, alpha=(1.0 - beta1))
    exp_avg_sq.mul_(beta2).add_(grad_projected.square(), alpha=(1.0 - beta2))
    denom = exp_avg_sq.sqrt().add_(o["epsilon"])
    norm_grad = soap_project_back(exp_avg / denom, st["Q"])
    soap_update_preconditioner(g, st, shampoo_beta, o)
    return norm_grad


def soap_step(params, grads, state, lr, step, o, decays):
    import torch

    shampoo_beta = o["shampoo_beta"] if o["shampoo_beta"] is not None else o["beta2"]
    for p, grad, st, decay in zip(params, grads, state, decays):
        if grad is None:
            continue
        dims, pre, _, blocks = soap_plan(list(p.shape), o)
        g = grad.reshape(dims)
        if not st:
            st["blocks"] = [{} for _ in blocks]
            st["step"] = 0
        direction = torch.zeros(dims)
        first = st["step"] == 0
        for block, bst in zip(blocks, st["blocks"]):
            out = soap_block_update(g[block].contiguous(), bst, o, shampoo_beta, pre)
            if out is not None:
                direction[block] = out
        if first:
            st["step"] = 1
            continue
        st["step"] += 1
        step_size = lr
        if o["correct_bias"]:
            k = st["step"] - 1
            step_size = step_size * ((1.0 - o["beta2"] ** k) ** .5) / (1.0 - o["beta1"] ** k)
        p.add_(direction.reshape(p.shape), alpha=-step_size)
        if decay and o["weight_decay"] > 0.0:
            p.add_(p, alpha=(-lr * o["weight_decay"]))


def soap_update_preconditioner(g, st, shampoo_beta, o):
    import torch

    if st["Q"] is not None:
        st["exp_avg2d"] = soap_project_back(st["exp_avg2d"], st["Q"])
    for idx, sh in enumerate(g.shape):
        if st["GG"][idx] is not None:
            other = [i for i in range(g.ndim) if i != idx]
            outer_product = torch.tensordot(g, g, dims=[other, other])
            st["GG"][idx].lerp_(outer_product, 1 - shampoo_beta)
    if st["Q"] is None:
        st["Q"] = [None if m is None else soap_eigenbasis(m) for m in st["GG"]]
    if st["step"] > 0 and st["step"] % int(o["precondition_frequency"]) == 0:
        st["Q"] = soap_refresh(st, o)
    if st["step"] > 0:
        st["exp_avg2d"] = soap_project(st["exp_avg2d"], st["Q"])


def soap_state(st, shape, o):
    """The state under loom's names: the moments in the parameter's shape, the statistics and
    bases of dimension d as GG<d>, Q<d>: [side, side], or [blocks, side, side] with blocks."""
    import torch

    dims, pre, sides, blocks = soap_plan(list(shape), o)
    exp_avg, exp_avg_sq = torch.zeros(dims), torch.zeros(dims)
    for block, bst in zip(blocks, st["blocks"]):
        exp_avg[block] = bst["exp_avg2d"]
        exp_avg_sq[block] = bst["exp_avg_sq2d"]
    out = {"exp_avg": exp_avg.reshape(shape), "exp_avg_sq": exp_avg_sq.reshape(shape),
           "step": torch.tensor([float(st["step"])])}
    for d, p in enumerate(pre):
        if not p:
            continue
        gg = torch.zeros(len(blocks), sides[d], sides[d])
        q = torch.zeros(len(blocks), sides[d], sides[d])
        for i, bst in enumerate(st["blocks"]):
            k = bst["GG"][d].shape[0]
            gg[i, :k, :k] = bst["GG"][d]
            q[i, :k, :k] = bst["Q"][d]
        out["GG%d" % d] = gg[0] if len(blocks) == 1 else gg
        out["Q%d" % d] = q[0] if len(blocks) == 1 else q
    return out


# Optimizers written out here (not in torch.optim): name -> step(params, grads, state, lr, step,
# options, decays), state being one dict of named tensors per parameter.
CUSTOM = {"muon": muon_step, "adafactor": adafactor_step, "soap": soap_step}


class Writer:
    def __init__(self):
        self.chunks = []
        self.size = 0

    def add(self, tensor):
        """Appends a float32 tensor; returns its offset in elements."""
        values = tensor.detach().to("cpu").contiguous().reshape(-1).tolist()
        offset = self.size
        self.chunks.append(struct.pack("<%df" % len(values), *values))
        self.size += len(values)
        return offset


def run_case(torch, writer, name, optimizer, options, lr0, seed, missing, parameters=None):
    """missing: set of (step, parameter index) pairs that get no gradient at that step;
    parameters: the case's own (name, shape, weight decay) list instead of PARAMETERS."""
    parameters = parameters or PARAMETERS
    gen = torch.Generator().manual_seed(seed)
    params = []
    for i, (_, shape, _) in enumerate(parameters):
        p = torch.randn(shape, generator=gen, dtype=torch.float32) * (0.5 + 0.25 * i)
        params.append(torch.nn.Parameter(p))
    case = {
        "name": name,
        "optimizer": optimizer,
        "options": options,
        "steps": STEPS,
        "lr": [],
        "params": [
            {"name": pname, "shape": shape, "weight_decay": wd, "initial": writer.add(params[i])}
            for i, (pname, shape, wd) in enumerate(parameters)
        ],
        "grads": [],
        "expected": [],
    }
    decayed = [p for p, (_, _, wd) in zip(params, parameters) if wd]
    undecayed = [p for p, (_, _, wd) in zip(params, parameters) if not wd]
    wd = options.get("weight_decay", 0.0)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(
            [{"params": decayed, "weight_decay": wd}, {"params": undecayed, "weight_decay": 0.0}],
            lr=lr0, betas=(options["beta1"], options["beta2"]), eps=options["epsilon"])
    elif optimizer == "sgd":
        opt = torch.optim.SGD(
            [{"params": decayed, "weight_decay": wd}, {"params": undecayed, "weight_decay": 0.0}],
            lr=lr0, momentum=options["momentum"], dampening=options["dampening"],
            nesterov=options["nesterov"])
    elif optimizer == "rmsprop":
        # Not one of loom's optimizers: the trajectory an out-of-tree RMSprop is checked against
        # (sdk/examples/rmsprop, through `loom conformance`).
        opt = torch.optim.RMSprop(
            [{"params": decayed, "weight_decay": wd}, {"params": undecayed, "weight_decay": 0.0}],
            lr=lr0, alpha=options["alpha"], eps=options["epsilon"])
    elif optimizer == "lion":
        moments = [torch.zeros_like(p) for p in params]
        lion_wd = [wd if pwd else 0.0 for (_, _, pwd) in parameters]
    elif optimizer in CUSTOM:
        custom_state = [{} for _ in params]
        decays = [pwd for (_, _, pwd) in parameters]
        case["tolerance"] = 1e-5
    else:
        raise ValueError(optimizer)

    for step in range(STEPS):
        # A schedule of sorts: the optimizers must use the lr they are given at each step.
        lr = lr0 * (1.0 - 0.5 * step / STEPS)
        case["lr"].append(lr)
        grads = []
        for i, p in enumerate(params):
            if (step, i) in missing:
                grads.append(None)
                continue
            g = torch.randn(p.shape, generator=gen, dtype=torch.float32) * (10.0 ** -(i % 3))
            if optimizer == "lion":
                # Keep c = beta1 m + (1 - beta1) g away from 0, where float rounding could flip
                # its sign between two correct implementations.
                b1 = options["beta1"]
                m = moments[i]
                while True:
                    c = m.double() * b1 + g.double() * (1.0 - b1)
                    near = c.abs() < 1e-3 * (10.0 ** -(i % 3))
                    if not bool(near.any()):
                        break
                    g = torch.where(near, g + 0.05 * (10.0 ** -(i % 3)), g)
            grads.append(g)
        case["grads"].append([None if g is None else writer.add(g) for g in grads])
        if optimizer == "lion":
            with torch.no_grad():
                lion_step(params, grads, moments, lr, options["beta1"], options["beta2"], lion_wd)
        elif optimizer in CUSTOM:
            with torch.no_grad():
                CUSTOM[optimizer](params, grads, custom_state, lr, step, options, decays)
        else:
            for p, g in zip(params, grads):
                p.grad = None if g is None else g.clone()
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
        case["expected"].append([writer.add(p) for p in params])

    state = {}
    for i, (pname, _, _) in enumerate(parameters):
        if optimizer == "lion":
            state["exp_avg/" + pname] = writer.add(moments[i])
            continue
        if optimizer == "soap":
            for key, tensor in soap_state(custom_state[i], list(params[i].shape), options).items():
                state[key + "/" + pname] = writer.add(tensor)
            continue
        if optimizer in CUSTOM:
            for key, tensor in custom_state[i].items():
                state[key + "/" + pname] = writer.add(tensor)
            continue
        s = opt.state.get(params[i], {})
        for key in ("exp_avg", "exp_avg_sq", "momentum_buffer", "square_avg"):
            if s.get(key) is not None:
                state[key + "/" + pname] = writer.add(s[key])
    case["expected_state"] = state
    return case


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torch_reference.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    index_path = os.path.join(out_dir, "index.json")
    try:
        import torch
    except Exception as e:  # ImportError, or a broken installation
        with open(index_path, "w") as f:
            json.dump({"skipped": "PyTorch is not importable by %s (%s: %s); install python3-torch "
                       "(scripts/install-deps.sh) to run the optimizer conformance test"
                       % (sys.executable, type(e).__name__, e)}, f)
        return
    torch.set_num_threads(1)
    writer = Writer()
    adamw_defaults = {"beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "weight_decay": 0.1}
    cases = [
        run_case(torch, writer, "adamw_levanter_defaults", "adamw", adamw_defaults, 6e-4, 1, set()),
        run_case(torch, writer, "adamw_large_lr", "adamw",
                 {"beta1": 0.8, "beta2": 0.999, "epsilon": 1e-6, "weight_decay": 0.01}, 3e-2, 2, set()),
        run_case(torch, writer, "adamw_no_decay", "adamw",
                 {"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8, "weight_decay": 0.0}, 1e-2, 3, set()),
        run_case(torch, writer, "sgd_plain_l2", "sgd",
                 {"momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 1e-2}, 0.1, 4,
                 {(3, 1)}),
        run_case(torch, writer, "sgd_momentum_dampening", "sgd",
                 {"momentum": 0.9, "dampening": 0.1, "nesterov": False, "weight_decay": 1e-2}, 0.05, 5,
                 {(0, 3), (1, 3), (4, 1)}),
        run_case(torch, writer, "sgd_nesterov", "sgd",
                 {"momentum": 0.9, "dampening": 0.0, "nesterov": True, "weight_decay": 1e-3}, 0.05, 6,
                 {(0, 1), (5, 3)}),
        run_case(torch, writer, "lion_paper_defaults", "lion",
                 {"beta1": 0.9, "beta2": 0.99, "weight_decay": 1.0}, 1e-3, 7, {(2, 3)}),
        run_case(torch, writer, "lion_other_betas", "lion",
                 {"beta1": 0.95, "beta2": 0.98, "weight_decay": 0.1}, 3e-3, 8, {(0, 1), (6, 4)}),
        run_case(torch, writer, "muon_jordan", "muon",
                 {"momentum": 0.95, "nesterov": True, "ns_steps": 5.0, "moonlight_scaling": False,
                  "weight_decay": 0.1, "adam_lr_scale": 0.03, "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8},
                 0.02, 9, {(0, 1), (3, 2)}),
        run_case(torch, writer, "muon_moonlight_heavy_ball", "muon",
                 {"momentum": 0.9, "nesterov": False, "ns_steps": 5.0, "moonlight_scaling": True,
                  "weight_decay": 0.0, "adam_lr_scale": 1.0, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-8},
                 3e-3, 10, {(2, 4)}),
        run_case(torch, writer, "adafactor_defaults", "adafactor",
                 {"decay_rate": -0.8, "clip_threshold": 1.0, "beta1": None, "epsilon1": 1e-30, "epsilon2": 1e-3,
                  "relative_step": False, "warmup_init": False, "scale_parameter": True, "weight_decay": 0.0},
                 1e-2, 11, {(0, 1), (4, 2)}),
        run_case(torch, writer, "adafactor_relative_step_first_moment", "adafactor",
                 {"decay_rate": -0.8, "clip_threshold": 1.0, "beta1": 0.9, "epsilon1": 1e-30, "epsilon2": 1e-3,
                  "relative_step": True, "warmup_init": True, "scale_parameter": True, "weight_decay": 0.01},
                 1.0, 12, {(1, 3)}),
        run_case(torch, writer, "adafactor_unscaled_clipped", "adafactor",
                 {"decay_rate": -0.5, "clip_threshold": 0.5, "beta1": None, "epsilon1": 1e-30, "epsilon2": 1e-3,
                  "relative_step": False, "warmup_init": False, "scale_parameter": False, "weight_decay": 0.1},
                 3e-3, 13, set()),
        # max_precond_dim 32: every preconditioned side then has full-rank statistics from the first
        # gradient on (a rank-deficient one has a degenerate eigenspace, whose basis any two
        # eigensolvers may choose differently): [37, 19] is preconditioned on the right only,
        # [3, 5, 7] (as [3, 35]) on the left only, [101, 693] not at all.
        run_case(torch, writer, "soap_authors_defaults", "soap",
                 {"beta1": 0.95, "beta2": 0.95, "shampoo_beta": None, "epsilon": 1e-8, "weight_decay": 0.01,
                  "precondition_frequency": 3.0, "max_precond_dim": 32.0, "block_size": None, "merge_dims": False,
                  "precondition_1d": False, "correct_bias": True},
                 3e-3, 14, {(0, 1), (4, 2)}),
        run_case(torch, writer, "soap_other_betas", "soap",
                 {"beta1": 0.9, "beta2": 0.99, "shampoo_beta": 0.9, "epsilon": 1e-8, "weight_decay": 0.0,
                  "precondition_frequency": 2.0, "max_precond_dim": 32.0, "block_size": None, "merge_dims": False,
                  "precondition_1d": False, "correct_bias": False},
                 1e-3, 15, set()),
        # Blocks of 4: [37, 19] in five blocks on the right ([37, 4] x 4, [37, 3]), [3, 5, 7] in four
        # ([3, 4, 4], [3, 4, 3], [3, 1, 4], [3, 1, 3]), each with full-rank statistics.
        run_case(torch, writer, "soap_blocks", "soap",
                 {"beta1": 0.95, "beta2": 0.95, "shampoo_beta": None, "epsilon": 1e-8, "weight_decay": 0.01,
                  "precondition_frequency": 2.0, "max_precond_dim": 32.0, "block_size": 4.0, "merge_dims": False,
                  "precondition_1d": False, "correct_bias": True},
                 3e-3, 18, {(0, 1), (3, 2)}),
        # merge_dims: [2, 3, 40] is preconditioned as [6, 40] (left only); precondition_1d on a
        # one-element vector (a larger one would start from a rank-one statistic, whose degenerate
        # eigenspace two eigensolvers fill differently: tests/.../soap_test.cpp covers it).
        run_case(torch, writer, "soap_merge_dims_precondition_1d", "soap",
                 {"beta1": 0.95, "beta2": 0.95, "shampoo_beta": None, "epsilon": 1e-8, "weight_decay": 0.01,
                  "precondition_frequency": 3.0, "max_precond_dim": 32.0, "block_size": None, "merge_dims": True,
                  "precondition_1d": True, "correct_bias": True},
                 3e-3, 19, {(2, 1)},
                 [("h.0.attn.c_attn.weight", [37, 19], True), ("ln_f.weight", [1], False),
                  ("h.0.mlp.experts.weight", [2, 3, 40], True)]),
        run_case(torch, writer, "rmsprop_torch_defaults", "rmsprop",
                 {"alpha": 0.99, "epsilon": 1e-8, "weight_decay": 0.0}, 1e-2, 16, {(1, 2), (4, 0)}),
        run_case(torch, writer, "rmsprop_l2", "rmsprop",
                 {"alpha": 0.9, "epsilon": 1e-6, "weight_decay": 1e-2}, 3e-3, 17, {(0, 3)}),
    ]
    with open(os.path.join(out_dir, "data.bin"), "wb") as f:
        for chunk in writer.chunks:
            f.write(chunk)
    with open(index_path, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
