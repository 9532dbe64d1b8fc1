"""
Train a language model: AdamW, warmup + cosine, clipping, memmapped token data, exact-resume checkpoints, and
one loop that runs from a laptop CPU to torchrun on a GPU node.

    python train.py                                    # the main job (offline, ~3 min on 2 CPU cores): stories ->
                                                       #   BPE -> token files -> 1.3M-param Llama for 2.5 min -> sample
    python train.py --fresh                            # the same, starting over instead of reusing what exists
    python train.py --preset=tinystories-cpu           # CS336 TinyStories baseline shape, 40.96M tokens (CPU)
    python train.py --preset=tinystories               # the same model, 327.68M tokens (one GPU)
    python train.py --preset=owt                       # OpenWebText, 32k tokenizer, same model
    torchrun --standalone --nproc_per_node=8 train.py --preset=gpt2-124m     # GPT-2 124M on FineWeb-Edu 10B
    torchrun --standalone --nproc_per_node=8 train.py --preset=gpt2-xl       # GPT-2 XL (1.56B): FSDP, checkpointing
    python train.py --preset=speedrun-cpu              # the best model 5 minutes of 2 CPU cores train (Muon, ...)
    python train.py --model=gpt2 --init_from=gpt2 --data_dir=data/mydata --out_dir=out/ft   # fine-tune GPT-2
    python train.py --preset=owt --time_budget=45m     # a fixed wall-clock run: the schedule follows the clock
    python train.py --resume                           # continue out/ckpt.pt exactly where it stopped
    python train.py --plot=out/log.jsonl               # loss vs steps / vs wall clock PNGs next to the log
    python train.py --help                             # every setting, with its default

Two nodes (run on each node, node_rank 0 and 1; master = the first node's address; --out_dir a folder both nodes
share, since only rank 0 writes checkpoints and every rank resumes them; the ranks agree on what they found before
the first step, and any difference stops them all in one line):
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 train.py ...

Every field of TrainConfig below, and of model.py's TransformerLMConfig / GPTConfig, is a flag (`--name=value`);
a preset changes a few of them (and writes to out/PRESET) and any flag still overrides it. Only rank 0 prints,
logs and writes checkpoints (under --fsdp each rank writes its shards beside them). Ctrl-C or SIGTERM (a
scheduler's preemption notice; under torchrun, to any rank) finishes the current step (under torchrun the step at
which the ranks next agree, within --log_interval steps), writes a checkpoint and stops; `--resume` then continues
bit for bit (on CPU) as if nothing happened. What a run must also do that is not the ML (data-folder checks, resume
compatibility, the out_dir lock and log, stop signals, plots) is in runs.py, called by name.

This file reads in the order of a run: its settings (TrainConfig), the optimizer, schedule, clipping, data, loss,
checkpoint and evaluation pieces, then train(), the loop. After train() come the set-up it calls by name (the
inputs, resume, processes, device, precision, FSDP) and the command line (flags, presets, checks, main()).
"""
import argparse
import contextlib
import functools
import math
import os
import random
import shlex
import sys
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.utils.checkpoint

import bpe
import flops
import hellaswag
import lambada
import model as model_lib
import runs
from model import setting
from sample import generate

# -----------------------------------------------------------------------------
# settings: each field is a flag with its default and --help, checked by its `check` / `choices` (a plain dataclass
# field, without setting(...), is a flag too: its help is its name, unchecked). The model's own settings are the
# fields of model.py's configs (TransformerLMConfig, GPTConfig), flags as well. "auto": on where the hardware supports
# it (CUDA), off elsewhere. resumable: may change when a run is resumed (all others must match the checkpoint).


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = setting("out", "folder for ckpt.pt, log.jsonl and plots (a preset's default: out/PRESET)",
                           path=True, resumable=True)
    data_dir: str = setting("data/tinystories", "folder with train*.bin / val*.bin token files (each with a "
                            ".bin.json sidecar)", path=True, resumable=True)   # resumable: a moved copy of the data
    prepare_data: bool = setting(True, "build data_dir with fineweb.prepare_tinystories first (downloads or generates "
                                 "stories; reused when done); off when --data_dir is given, unless also given",
                                 resumable=True)
    corpus_bytes: int = setting(4_000_000, "with --prepare_data: bytes of TinyStories (or generated stories) to "
                                "prepare", resumable=True)
    download: bool = setting(True, "with --prepare_data: try TinyStories from the Hugging Face hub before generating "
                             "stories", resumable=True)
    preset: str = setting("", "tinystories | tinystories-cpu | owt | gpt2-124m | gpt2-xl | speedrun-cpu | "
                          "speedrun-gpu (sets the documented values; flags still override)", resumable=True)
    resume: str = setting("auto", "continue out_dir/ckpt.pt: auto = when it holds this run (another run's, of other "
                          "settings or data, stops this one before any work), true = must (on other data too, when "
                          "its model can read it), false = never", auto=True, resumable=True)
    fresh: bool = setting(False, "start over: replace out_dir's checkpoint and log (and re-prepare the data of the "
                          "main job)", resumable=True)
    init_from: str = setting("scratch", "scratch, or gpt2 | gpt2-medium | gpt2-large | gpt2-xl (released weights) or "
                             "a local Hugging Face GPT-2 folder", path=True, arch="gpt2")
    plot: str = setting("", "one or more log.jsonl (comma-separated): draw their curves into one PNG beside the first "
                        "(curves.png, or compare.png for several) and exit", path=True, resumable=True)
    wandb: bool = setting(False, "also log to Weights & Biases (only if wandb is installed)", resumable=True)
    wandb_project: str = setting("lmscratch", "wandb project name", resumable=True)
    # model: --model picks the architecture; its fields (model.py) follow in --help
    model: str = setting("llama", "llama (TransformerLM, CS336 naming) or gpt2 (GPT, nanoGPT naming)",
                         choices=("llama", "gpt2"))
    pad_vocab: str = setting("auto", "GPT-2: pad the vocabulary to a multiple of 64 (auto = on CUDA)", auto=True,
                             arch="gpt2")
    # data and batch
    sampler: str = setting("sequential", "sequential (shards in order, shuffled per epoch, rank strides) | random "
                           "(CS336 windows)", choices=("sequential", "random"))
    shuffle_first_epoch: bool = setting(True, "sequential sampler: shuffle the first epoch too (false: read it in "
                                        "stream order, the shards in name order and the documents as written, as "
                                        "build-nanogpt does; later epochs are shuffled either way)")
    batch_size: int = setting(32, "sequences per micro-step per process", check=">= 1")
    total_batch_tokens: int = setting(0, "tokens per optimizer step (0 = batch_size*context_length*world); sets grad "
                                      "accumulation", check=">= 0")
    # optimizer and schedule
    optimizer: str = setting("adamw", "adamw | muon (Muon for the blocks' matrices, at AdamW's learning rate and "
                             "weight decay; AdamW for embeddings, head and gains)", choices=("adamw", "muon"))
    learning_rate: float = setting(3e-3, "peak learning rate", check="finite and >= 0")
    embedding_lr_scale: float = setting(1.0, "the embeddings' learning rate as a multiple of --learning_rate (the "
                                        "schedule moves both; a head tied to them goes with them)",
                                        check="finite and >= 0")
    head_lr_scale: float = setting(1.0, "the output head's learning rate as a multiple of --learning_rate",
                                   check="finite and >= 0")
    lr_schedule: str = setting("cosine", "cosine (warmup, then cosine down to min_lr_ratio) | wsd (warmup, flat at "
                               "the peak, then linear down to min_lr_ratio over the last --cooldown_frac)",
                               choices=("cosine", "wsd"))
    cooldown_frac: float = setting(0.2, "wsd: the share of the schedule's length spent decaying", check="in [0, 1]")
    min_lr_ratio: float = setting(0.1, "the schedule ends at min_lr_ratio * learning_rate", check="in [0, 1]")
    warmup_iters: int = setting(50, "linear warmup steps", check=">= 0")
    warmup_from_one: bool = setting(False, "count warmup steps from 1, as build-nanogpt: step s < warmup_iters trains "
                                    "at lr*(s+1)/warmup_iters, so step 0 already learns (false: CS336's "
                                    "lr*s/warmup_iters, 0 at step 0)")
    max_iters: int = setting(1000, "optimizer steps (the run ends at max_iters or when --time_budget is spent, the "
                             "first)", check=">= 0", resumable=True)
    lr_decay_iters: int = setting(0, "schedule length in steps (0 = max_iters)", check=">= 0", resumable=True)
    time_budget: str = setting("2.5m", "training time limit, e.g. 45m, 90s, 1.5h ('' = none); the schedule follows "
                               "the clock", resumable=True)
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay (2-D weights only)", check="finite and >= 0")
    ema: float = setting(0.0, "average the weights over the run, an exponential moving average of this decay (e.g. "
                         "0.99; 0 = none): the evaluations score the average and the checkpoint's model is it (the "
                         "trained weights, which training goes on from, are kept beside it)", check="in [0, 1)")
    beta1: float = setting(0.9, "AdamW beta1", check="in [0, 1)")
    beta2: float = setting(0.95, "AdamW beta2", check="in [0, 1)")
    eps: float = setting(1e-8, "AdamW epsilon", check="finite and >= 0")
    z_loss: float = setting(0.0, "add z_loss * logsumexp(logits)^2 to the training loss (PaLM's z-loss; 0 = off)",
                            check=">= 0", arch="llama")
    chunked_loss: bool = setting(False, "the training loss computed with the head, 256 positions at a time "
                                 "(model.linear_cross_entropy: the (tokens, vocab) logits never whole; faster on "
                                 "CPU in bf16 at vocab 4,096+, slower at the main job's d64)", arch="llama")
    grad_clip: float = setting(1.0, "clip the global gradient L2 norm to this (0 = off)", check=">= 0")
    fused: str = setting("auto", "use PyTorch's fused AdamW (auto = on CUDA); otherwise this file's AdamW", auto=True,
                         resumable=True)
    # evaluation, logging, checkpoints
    eval_interval: int = setting(250, "evaluate (val loss, bits/byte, a sample) every N steps and at the end",
                                 check=">= 1", resumable=True)
    eval_iters: int = setting(10, "validation batches per evaluation", check=">= 1", resumable=True)
    eval_tokens: int = setting(0, "validation tokens per evaluation, a multiple of batch_size*context_length*"
                               "world_size (0 = eval_iters batches); the same number scores runs of any batch size "
                               "on the same text", check=">= 0", resumable=True)
    log_interval: int = setting(10, "print a line every N steps (and at the step the run ends)", check=">= 1",
                                resumable=True)
    ckpt_interval: int = setting(0, "write ckpt.pt every N steps (0 = at every evaluation); always at the end",
                                 check=">= 0", resumable=True)
    num_samples: int = setting(1, "samples generated at each evaluation", check=">= 0", resumable=True)
    sample_tokens: int = setting(64, "tokens per sample", check=">= 0", resumable=True)
    temperature: float = setting(0.8, "sampling temperature (0 = greedy)", check="finite and >= 0", resumable=True)
    top_p: float = setting(0.9, "nucleus sampling threshold", check="in (0, 1]", resumable=True)
    sample_prompt: str = setting("Once upon a time", "prompt for the samples", resumable=True)
    hellaswag: bool = setting(False, "HellaSwag accuracy at each evaluation (needs hellaswag.py)", resumable=True)
    hellaswag_path: str = setting("", "local HellaSwag jsonl (default: the official val set, downloaded once)",
                                  path=True, resumable=True)
    lambada: bool = setting(False, "LAMBADA last-word accuracy and perplexity at each evaluation (needs lambada.py)",
                            resumable=True)
    lambada_path: str = setting("", "local LAMBADA jsonl (default: OpenAI's test set, downloaded once)", path=True,
                                resumable=True)
    # system
    device: str = setting("auto", "auto | cpu | cuda | cuda:N", resumable=True)
    dtype: str = setting("auto", "autocast dtype: auto (bfloat16 on a GPU with native bf16, and on a CPU with native "
                         "bf16 for d_model >= 96; else float32) | float32 | bfloat16",
                         choices=("auto", "float32", "bfloat16"))
    compile: str = setting("auto", "torch.compile the training module (auto = on CUDA); eval and sampling use the "
                           "plain module", auto=True, resumable=True)
    compile_backend: str = setting("inductor", "torch.compile backend", resumable=True)
    tf32: str = setting("auto", "TF32 matmuls on CUDA", auto=True)
    deterministic: bool = setting(False, "bit-exact CUDA runs: torch.use_deterministic_algorithms and cuBLAS's fixed "
                                  "workspace, at some speed (CPU runs are bit-exact without it)", resumable=True)
    num_threads: int = setting(0, "torch CPU threads (0 = torch's default)", check=">= 0", resumable=True)
    # past one GPU's memory (see the section "FSDP, activation checkpointing, sharded checkpoints" below)
    fsdp: bool = setting(False, "under torchrun: shard the weights, gradients and optimizer state over the processes "
                         "(PyTorch's FSDP2) instead of DDP's whole copy on each; checkpoints are then sharded "
                         "(torch.distributed.checkpoint) and resume on any number of processes. One process trains as "
                         "without it (nothing to shard) and writes the same sharded checkpoint")
    activation_checkpointing: bool = setting(False, "keep only each block's input and recompute its activations in "
                                             "the backward: far less memory for about one more forward; changes no "
                                             "number", resumable=True)
    seed: int = setting(1337, "seed for init, data order and sampling", check="in [0, 2**32)")


class Settings(dict):
    """A run's settings (every flag by name: TrainConfig's and the model's), the dict that checkpoints and logs
    store, whose keys also read as attributes (c.batch_size). train() wraps them once (check_config's result)."""
    __getattr__ = dict.__getitem__


# -----------------------------------------------------------------------------
# optimizer, schedule, clipping (from primitives)

class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019) with the same arithmetic and state names as torch.optim.AdamW.
    lr and weight_decay are read from each param group at every step, so a schedule just writes group["lr"]."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **more):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or weight_decay < 0:
            raise ValueError(f"AdamW: invalid hyperparameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **more))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self.update(group)
        return loss

    def update(self, group):
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)   # a tensor, like torch's, so state dicts interchange
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            # (local: under --fsdp, this rank's shard of each, updated in place; else the tensor itself: the FSDP
            # pieces follow train())
            p, g, m, v = (local(t) for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"]))
            state["step"] += 1
            t = state["step"].item()
            p.mul_(1 - lr * wd)                          # decoupled weight decay, before the Adam update
            m.lerp_(g, 1 - beta1)                        # m = beta1 m + (1 - beta1) g
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            bias1 = 1 - beta1 ** t
            bias2 = 1 - beta2 ** t
            denom = (v.sqrt() / bias2 ** 0.5).add_(eps)
            p.addcdiv_(m, denom, value=-lr / bias1)


def orthogonalise(G, steps=5, dtype=torch.float32):
    """About U V^T for G = U S V^T: a quintic Newton-Schulz iteration whose coefficients (Jordan et al. 2024) take
    every singular value to roughly 0.7-1.2 in 5 steps, all the accuracy Muon needs, in matmuls only. G may be a
    stack (..., rows, cols): each matrix on its own, in batched matmuls. dtype: the iteration's (bfloat16 is as
    accurate as Muon needs: Jordan et al. run it so on GPUs)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.float()
    X = (X / (torch.linalg.matrix_norm(X, keepdim=True) + 1e-7)).to(dtype)   # the norm bounds every singular value
    tall = X.size(-2) > X.size(-1)
    if tall:   # X X^T on the short side
        X = X.mT
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return (X.mT if tall else X).to(G.dtype)


class Muon(AdamW):
    """Muon (Jordan et al. 2024) for the param groups marked muon=True (the blocks' matrices), this file's AdamW for
    the others (embeddings, head, gains). A Muon step is Nesterov momentum whose update is orthogonalised, then
    scaled by 0.2 sqrt(max(rows, cols)) so its RMS matches AdamW's (Liu et al. 2025): both kinds of group share one
    learning rate, schedule and weight decay."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, momentum=0.95, ns_steps=5,
                 ns_dtype=torch.float32):
        super().__init__(params, lr, betas, eps, weight_decay, muon=False, momentum=momentum, ns_steps=ns_steps)
        self.ns_dtype = ns_dtype   # the Newton-Schulz matmuls' (not in the state dict: a resume takes its own run's)

    def update(self, group):
        if not group["muon"]:
            return super().update(group)
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        stacks = {}   # the matrices of one shape, orthogonalised together: a few batched matmuls instead of many small
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)          # buf = mu buf + (1 - mu) g
            g = p.grad.lerp(buf, mu)           # Nesterov: the gradient moved toward the momentum
            # (under --fsdp each matrix alone: whole gathers it from the ranks just before its Newton-Schulz steps, as
            # a stack of whole matrices would hold what FSDP saves; shard_like takes this rank's rows of the update)
            stacks.setdefault(id(p) if sharded(p) else p.shape, []).append((p, g))
        for stack in stacks.values():
            updates = orthogonalise(torch.stack([whole(g) for _, g in stack]), group["ns_steps"], self.ns_dtype)
            for (p, _), u in zip(stack, updates):
                p.mul_(1 - lr * wd)
                p.add_(shard_like(u, p), alpha=-lr * 0.2 * max(p.shape) ** 0.5)


def make_optimizer(raw, c, fused, bf16=False):
    """The run's optimizer over model.param_groups (weight decay on the 2-D weights only): this file's AdamW,
    torch's fused AdamW (fused: --fused on CUDA), or with --optimizer=muon Muon for the blocks' matrices, whose
    Newton-Schulz steps run in bfloat16 where the run's matmuls do (bf16: the run autocasts to it)."""
    groups = scaled_lr_groups(model_lib.param_groups(raw, c.weight_decay, muon=c.optimizer == "muon"), raw, c)
    if c.optimizer == "muon":
        return Muon(groups, lr=c.learning_rate, betas=(c.beta1, c.beta2), eps=c.eps,
                    ns_dtype=torch.bfloat16 if bf16 else torch.float32)
    if fused:
        return torch.optim.AdamW(groups, lr=c.learning_rate, betas=(c.beta1, c.beta2), eps=c.eps, fused=True)
    return AdamW(groups, lr=c.learning_rate, betas=(c.beta1, c.beta2), eps=c.eps)


def scaled_lr_groups(groups, raw, c):
    """--embedding_lr_scale / --head_lr_scale: the embeddings and the head leave the decayed group (groups[0]) for
    groups of their own, whose "lr_scale" the loop multiplies the scheduled learning rate by. At 1 (the defaults)
    the groups stay as they were, so older checkpoints' optimizer states still load."""
    m = model_lib.unwrap(raw)
    embeddings = [mod.weight for mod in m.modules() if isinstance(mod, (model_lib.Embedding, nn.Embedding))]
    tied = any(m.lm_head.weight is e for e in embeddings)   # a tied head is an embedding
    for params, scale in ((embeddings, c.embedding_lr_scale), ([] if tied else [m.lm_head.weight], c.head_lr_scale)):
        if scale != 1 and params:
            moved = {id(p) for p in params}
            groups[0]["params"] = [p for p in groups[0]["params"] if id(p) not in moved]
            groups.append({"params": params, "weight_decay": groups[0]["weight_decay"], "lr_scale": scale})
    return groups


def get_lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters):
    """Linear warmup to max over warmup_iters, cosine down to min at cosine_cycle_iters, then flat at min."""
    if it < warmup_iters:
        return max_learning_rate * it / warmup_iters
    if it >= cosine_cycle_iters:
        return min_learning_rate
    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
    return min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (max_learning_rate - min_learning_rate)


def get_lr_wsd_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, total_iters, cooldown_frac):
    """Warmup-stable-decay: linear warmup to max, flat at max, then linear down to min over the last cooldown_frac
    of total_iters, then flat at min."""
    if it < warmup_iters:
        return max_learning_rate * it / warmup_iters
    decay_start = max(warmup_iters, total_iters * (1 - cooldown_frac))
    if it < decay_start:
        return max_learning_rate
    if it >= total_iters:
        return min_learning_rate
    progress = (it - decay_start) / (total_iters - decay_start)
    return max_learning_rate + progress * (min_learning_rate - max_learning_rate)


def scheduled_lr(c, step, elapsed):
    """A run's learning rate at `step` after `elapsed` seconds of training. Under --time_budget the schedule follows
    whichever is further along, steps or the clock (elapsed time mapped onto the step axis 0..max_iters), so with
    the default lr_decay_iters (= max_iters) it ends when the budget does. --warmup_from_one shifts the warmup by
    one step (build-nanogpt's), leaving the schedule functions CS336's. c: the settings by name (a dict)."""
    budget = runs.parse_duration(c["time_budget"])
    it = step if budget is None else max(step, min(elapsed / budget, 1.0) * c["max_iters"])
    peak, warmup = c["learning_rate"], c["warmup_iters"]
    if c["warmup_from_one"] and it < warmup:   # build-nanogpt's warmup: lr*(it+1)/warmup (the schedules' own
        it = min(it + 1, warmup)                 # contract, CS336's, is lr*it/warmup)
    lo, length = peak * c["min_lr_ratio"], c["lr_decay_iters"] or c["max_iters"]
    if c["lr_schedule"] == "wsd":
        return get_lr_wsd_schedule(it, peak, lo, warmup, length, c["cooldown_frac"])
    return get_lr_cosine_schedule(it, peak, lo, warmup, length)


@torch.no_grad()
def gradient_clipping(parameters, max_l2_norm, eps=1e-6):
    """Scale all gradients in place so their global L2 norm is at most max_l2_norm; returns the pre-clip norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    # multi-tensor kernels (torch._foreach_*): on CUDA a few launches for all the gradients, not one norm and one
    # multiply per tensor; on the CPU they loop over the tensors with the same per-tensor ops, so the same numbers.
    # (local: under --fsdp, a gradient's shard on this rank)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([local(g) for g in grads], 2, dtype=torch.float32)))
    if sharded(grads[0]):   # FSDP: this rank's norm is its shards'; the global norm's square sums theirs
        square = norm.square()
        torch.distributed.all_reduce(square, group=grads[0].device_mesh.get_group())
        norm = square.sqrt()
    scale = torch.clamp(max_l2_norm / (norm + eps), max=1.0)   # no .item(): no GPU sync on the hot path
    torch._foreach_mul_([local(g) for g in grads], scale)
    return norm


class WeightAverage:
    """--ema: an exponential moving average of the weights, updated after every optimizer step. Step t averages in
    the new weights at 1 - min(decay, 1 - 1/t): the plain mean of the steps so far, until it becomes the moving
    average (after 1/(1 - decay) steps), so no step's weights (the init's either) weigh more than the decay says.
    A copy of the parameters (this rank's shards under --fsdp); with decay 0 it holds nothing and does nothing."""

    def __init__(self, raw, decay):
        self.decay, self.params = decay, dict(raw.named_parameters())
        self.average = {n: p.detach().clone() for n, p in self.params.items()} if decay else {}

    @torch.no_grad()
    def update(self, step):
        """Average in the weights after optimizer step `step` (1, 2, ...)."""
        weight = 1 - min(self.decay, 1 - 1 / step)
        for name, avg in self.average.items():
            local(avg).lerp_(local(self.params[name]), weight)

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self):
        """The average in the model's parameters for the time of the block (an evaluation, a checkpoint's "model"),
        the trained weights back after; yields the trained weights ({name: tensor}; None without --ema)."""
        if not self.decay:
            yield None
            return
        trained = {n: p.detach().clone() for n, p in self.params.items()}
        for name, p in self.params.items():
            local(p).copy_(local(self.average[name]))
        try:
            yield trained
        finally:
            for name, p in self.params.items():
                local(p).copy_(local(trained[name]))

    @torch.no_grad()
    def resume(self, trained):
        """After a checkpoint's "model" (the average) was loaded into the model: that is the average, and the
        parameters go back to its trained weights, which training continues from."""
        for name, p in self.params.items():
            local(self.average[name]).copy_(local(p))
            local(p).copy_(local(trained[name]))


# -----------------------------------------------------------------------------
# data loading: token files (memmapped, checked by runs.py) -> batches. get_batch is the lesson (random windows);
# a run reads through one of runs.py's samplers (random windows on its own RNG, or build-nanogpt's sequential order
# with each epoch shuffled), whose position a checkpoint keeps, one batch ahead of the loop (runs.ReadAhead)

def get_batch(dataset, batch_size, context_length, device, rng=None):
    """Random windows (CS336): x = dataset[s:s+T], y = dataset[s+1:s+T+1] for random s in [0, len-T-1]."""
    high = len(dataset) - context_length   # exclusive bound, so the largest start is len - T - 1
    if high < 1:
        raise ValueError(f"get_batch: {len(dataset)} tokens is too few for context_length {context_length}")
    starts = rng.integers(0, high, size=batch_size) if rng is not None else np.random.randint(0, high, size=batch_size)
    buf = np.stack([dataset[s:s + context_length + 1] for s in starts]).astype(np.int64)
    return runs.batch_to_device(torch.from_numpy(buf), device)


def grad_accum_steps(total_batch_tokens, batch_size, context_length, world_size):
    """Micro-steps per optimizer step: --total_batch_tokens over the tokens one micro-step of all processes reads
    (0: one micro-step)."""
    per_step = batch_size * context_length * world_size
    if total_batch_tokens == 0:
        return 1
    if total_batch_tokens % per_step:
        raise ValueError(f"--total_batch_tokens={total_batch_tokens:,} is not divisible by batch_size*context_length"
                         f"*world_size = {batch_size}*{context_length}*{world_size} = {per_step:,}; pick a multiple")
    return total_batch_tokens // per_step


def make_loader(data, c, rank, world, log):
    """This rank's training sampler over the token files (data: runs.open_data's), as --sampler says: random
    windows (runs.RandomSampler) or the files in order, shuffled per epoch, rank r of W taking every W-th window
    (runs.SequentialSampler)."""
    B, T = c.batch_size, c.context_length
    if c.sampler == "random":
        return runs.RandomSampler(data.train, B, T, seed=c.seed, rank=rank)
    short = [str(p) for p, a, _ in data.train if len(a) < B * T * world + 1]
    if short:   # the reader skips them: say so rather than train on less data in silence
        log(f"train.py: {len(short)} training file(s) shorter than one batch ({B * T * world + 1:,} tokens) "
            f"will never be read: {', '.join(short[:3])}{' ...' if len(short) > 3 else ''}")
    return runs.SequentialSampler(data.train, B, T, rank, world, seed=c.seed, eot_id=data.eot_id,
                                  shuffle_first_epoch=c.shuffle_first_epoch)


# -----------------------------------------------------------------------------
# the loss: the module that is compiled and trained

class LossOf(nn.Module):
    """The module train.py compiles and wraps in DDP: (x, y) -> mean next-token loss, so the loss is inside the
    compiled graph for both models. TransformerLM.forward returns logits: compiling it alone left Llama's
    cross-entropy over the (tokens, vocab) logits eager, 387k against 472k tok/s at the GPT-2 124M shape on an H200.
    The model is .module, so model.unwrap() sees through this as through DDP. z_loss (Llama): PaLM's auxiliary
    z_loss * logsumexp(logits)^2, which keeps the softmax's normaliser near 1."""

    def __init__(self, model, arch, z_loss=0.0, chunked=False):
        super().__init__()
        self.module, self.arch, self.z_loss, self.chunked = model, arch, z_loss, chunked

    @contextlib.contextmanager
    def no_sync(self):
        """Under FSDP (DDP wraps this module and brings its own): the gradients of the micro-steps inside are kept
        whole and summed, and the first backward outside reduce-scatters the sum, once per optimizer step."""
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    def forward(self, x, y):
        if self.chunked and not self.z_loss:   # --chunked_loss (Llama): the model's own loss, head and loss together
            return self.module(x, targets=y)
        if not self.z_loss:
            return model_lib.lm_loss(self.module, x, y, arch=self.arch)
        logits = self.module(x)
        return model_lib.cross_entropy(logits, y) + self.z_loss * torch.logsumexp(logits.float(), -1).square().mean()


# -----------------------------------------------------------------------------
# checkpoints

def save_checkpoint(model, optimizer, iteration, out, **extra):
    """torch.save {model, optimizer, iteration, model_config, **extra} to a path (atomically: temp file, fsync,
    rename, so a crash mid-write never leaves a broken ckpt.pt) or to a binary file object."""
    raw = model_lib.unwrap(model)
    obj = {"model": model_lib.unwrapped_state_dict(raw.state_dict()), "optimizer": optimizer.state_dict(),
           "iteration": int(iteration)}
    if hasattr(raw, "model_config"):
        obj["model_config"] = raw.model_config()
    obj.update(extra)
    if isinstance(out, (str, os.PathLike)):
        save_atomically(obj, out)
    else:
        torch.save(obj, out)


def save_atomically(obj, out):
    """torch.save to the path out through a temporary file, fsynced, then renamed over it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: after a power cut ckpt.pt is the old or the new one
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)  # a failed (disk full) or interrupted write leaves no partial file


def load_checkpoint(src, model, optimizer=None):
    """Restore model (and optimizer) state from a path or file object; returns the iteration it was saved at."""
    ckpt = runs.read_train_checkpoint(src)
    model_lib.unwrap(model).load_state_dict(model_lib.unwrapped_state_dict(ckpt["model"]))
    if optimizer is not None and ckpt.get("optimizer") is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    return int(ckpt["iteration"])


def save_run(path, raw, optimizer, loader, state, c, data, world, average):
    """The run's checkpoint (rank 0 writes it; under --fsdp every rank writes its shards): with every RNG, every
    rank's loader position and the RunState, all an exact resume needs, and the settings and data it checks that a
    resume continues the same run with. Under --ema its "model" is the weight average (what sample.py, export.py
    and the evaluations read) and "trained_weights" the weights training continues from."""
    loaders, rngs = [loader.state_dict()], [runs.rng_state()]
    if world > 1:
        loaders = [None] * world
        torch.distributed.all_gather_object(loaders, loader.state_dict())
        if c.fsdp:   # (every rank's RNGs, its GPU's included; DDP keeps rank 0's)
            rngs = [None] * world
            torch.distributed.all_gather_object(rngs, runs.rng_state())
    run = dict(config=dict(c), tokenizer=data.tokenizer_ref or "", tokenizer_fingerprint=data.fingerprint,
               train_files=data.train_files, val_loss=state.val_loss, val_step=state.val_step, elapsed=state.elapsed)
    try:
        with average.swapped_in() as trained:
            if c.fsdp:
                save_sharded(path, raw, optimizer, state.step, world, trained, rng=rngs, loader=loaders, **run)
            elif int(os.environ.get("RANK", "0")) == 0:
                save_checkpoint(raw, optimizer, state.step, path, rng=rngs[0],
                                loader=loaders if world > 1 else loaders[0],
                                **run, **({} if trained is None else {"trained_weights": trained}))
    except (OSError, RuntimeError) as e:   # a full disk: ENOSPC, or torch's writer's "unexpected pos"
        raise runs.checkpoint_not_written(path, state.step, e) from None


# -----------------------------------------------------------------------------
# evaluation: validation loss, bits per byte, samples (downstream tasks: hellaswag.py, lambada.py; when and what
# a run evaluates: Evaluator, after train())

@torch.no_grad()
def estimate_val_loss(model, shards, c, arch, device, autocast, rank, world, eval_iters):
    """Mean next-token loss (nats) over the first eval_iters*B*T*world tokens of the validation data."""
    loader = runs.SequentialSampler(shards, c["batch_size"], c["context_length"], rank, world, shuffle=False)
    model.eval()
    total = torch.zeros((), device=device)
    for _ in range(eval_iters):
        x, y = loader.next_batch(device)
        with autocast:
            total += model_lib.lm_loss(model, x, y, arch=arch).float()
    model.train()
    total /= eval_iters
    if world > 1:
        torch.distributed.all_reduce(total)   # SUM then divide: ReduceOp.AVG is NCCL-only on older torch
        total /= world
    return total.item()


def bytes_per_token(tokenizer, ids, eot_id):
    """Bytes per token: the tokens' own bytes, so a UTF-8 character cut at either end of the window counts only the
    bytes inside it (eot tokens count as tokens with 0 bytes)."""
    ids = [int(t) for t in ids]
    return len(tokenizer.decode_bytes([t for t in ids if t != eot_id])) / max(1, len(ids))


def generate_samples(model, tokenizer, c, device, autocast, seed):
    """A few samples from the plain (uncompiled) module: generation's changing shapes would recompile."""
    prompt = tokenizer.encode(c["sample_prompt"]) if c["sample_prompt"] else [tokenizer.eot_id or 0]
    prompt = prompt[-model.context_length:]   # (the run said so once, at its start)
    g = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    with autocast:
        outs = generate(model, [prompt] * c["num_samples"], c["sample_tokens"], temperature=c["temperature"],
                        top_p=c["top_p"], stop_token=tokenizer.eot_id, generator=g)
    model.train()
    return [tokenizer.decode(prompt + list(o)) for o in outs]


# -----------------------------------------------------------------------------
# the training run

def train(cfg, clock=time.perf_counter, on_step=None, log=runs.say, resume_from=None, teardown=True):
    """Run one training job; cfg: every setting by name (DEFAULTS, a preset, flags). Returns a summary dict.
    clock: the time source of --time_budget (tests pass a fake one); on_step(step): called after each optimizer
    step (tests crash a run there); resume_from: the checkpoint main() read (else --resume=true reads it), or
    under torchrun the error main() met reading it;
    teardown: under DDP, destroy the process group at the end (a test running ranks in threads keeps it).
    What it calls by name (Evaluator, check_config, init_processes, precision, resume_checkpoint, open_inputs,
    parallelize) follows it in this file; runs.* is the run management."""
    c = check_config(cfg)   # the run's settings (a Settings: c.batch_size), refused here if bad
    # ---- processes, device, precision
    rank, world, device = init_processes(c)
    ddp, master = world > 1, rank == 0
    say = log if master else runs.quiet
    hw, autocast = precision(c, device, world)
    random.seed(c.seed)
    np.random.seed(c.seed)
    torch.manual_seed(c.seed)   # same on every rank: identical init (DDP also broadcasts rank 0's weights)
    ckpt_path = Path(c.out_dir) / "ckpt.pt"
    ckpt = resume_checkpoint(resume_from, c, ckpt_path, world)   # agreed by the ranks, as the data is below

    # ---- data
    if c.prepare_data:
        runs.prepare_main_job(c, ddp, master, say, ckpt, ckpt_path)
    data, tasks = open_inputs(c, ckpt, ckpt_path, world, say)   # token files, tokenizer, tasks' examples
    B, T = c.batch_size, c.context_length
    accum = grad_accum_steps(c.total_batch_tokens, B, T, world)
    tokens_per_step = B * T * accum * world
    budget = runs.parse_duration(c.time_budget)

    # ---- model, optimizer, loader: new, or resumed from out_dir/ckpt.pt
    if ckpt is not None:
        raw = runs.model_of(ckpt, ckpt_path)
    elif c.init_from != "scratch":
        raw = model_lib.GPT.from_pretrained(c.init_from, pad_vocab_to_multiple_of=hw["pad_vocab"],
                                            attn_impl=c.attn_impl)
    else:
        raw = model_lib.build_model(model_lib.config_from_flags(c.model, c, data.vocab_size, hw["pad_vocab"]))
    runs.check_model_fits(raw, data, c, ckpt, ckpt_path)
    raw.to(device)
    arch, mcfg = raw.model_config()["arch"], raw.model_config()
    parallelize(raw, c, world, device, hw)   # --activation_checkpointing, --fsdp: before the optimizer sees the weights
    optimizer = make_optimizer(raw, c, hw["fused"], bf16=hw["dtype"] == "bfloat16")
    decay_iters = c.lr_decay_iters or c.max_iters
    if c.warmup_iters >= decay_iters:   # e.g. the defaults' 50 warmup steps in a run shortened to 20
        say(f"train.py: --warmup_iters={c.warmup_iters} is not below the schedule's length of {decay_iters} steps "
            f"(--lr_decay_iters, else --max_iters): the learning rate never reaches --learning_rate")
    loader = runs.ReadAhead(make_loader(data, c, rank, world, say))   # the loop fetches each batch a micro-step early
    state = runs.RunState()
    if ckpt is not None:   # lrs: the learning rate at its step by its run's schedule and by this run's (restore says
        # what a resume's new --time_budget or --max_iters does to it)
        then = {**c, **runs.schedule_length(ckpt["config"])}
        lrs = [scheduled_lr(s, int(ckpt["iteration"]), ckpt["elapsed"]) for s in (then, c)]
        state = runs.restore(ckpt, ckpt_path, raw, optimizer, loader, c, data, world, rank, hw["fused"], lrs, say)
    average = WeightAverage(raw, c.ema)   # --ema (resumed: the checkpoint's "model" is the average, now in raw)
    if ckpt is not None and c.ema:
        average.resume(ckpt["trained_weights"])
    model = LossOf(raw, arch, c.z_loss, c.chunked_loss)   # (x, y) -> loss: compiled, in the graph with the model
    if hw["compile"]:
        model = torch.compile(model, backend=c.compile_backend)
    if ddp and not c.fsdp:   # (DDP broadcasts Llama's constant RoPE buffers every forward: small. The switch against
        # that, broadcast_buffers, warns on every rank in torch 2.13, and its successor fails on older versions)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    evaluate = Evaluator(raw, data, c, device, autocast, rank, world, say, tasks, average)
    flops_per_token = flops.train_flops_per_token(mcfg, T)

    # ---- the run's folder (checked above before anything is written): lock, log
    run = runs.RunDir(c, state.step if ckpt is not None else None, master, say)
    n_params = sum(p.numel() for p in raw.parameters())
    say(f"model {arch}: {n_params / 1e6:.2f}M parameters | data {c.data_dir}: "
        f"{sum(len(a) for _, a, _ in data.train):,} train / {sum(len(a) for _, a, _ in data.val):,} val tokens | "
        f"{tokens_per_step:,} tokens/step = {B} x {T} x {accum} accum x {world} procs | {device} {hw['dtype']}"
        + (f" ({hw['dtype_why']})" if c.dtype == "auto" else "") + (" | compiled" if hw["compile"] else "")
        + (" | FSDP" if c.fsdp and ddp else "") + (" | activation checkpointing" if c.activation_checkpointing else ""))
    run.record("config", **c, model_config=mcfg, tokenizer=data.tokenizer_ref, world_size=world, params=n_params,
               resumed_at_step=state.step if ckpt is not None else None, used=dict(hw, device=str(device)))

    # ---- the loop
    start_step, start_elapsed, samples, stop_at, batch = state.step, state.elapsed, [], None, None
    last_lr = scheduled_lr(c, state.step, state.elapsed)
    ckpt_every = c.ckpt_interval or c.eval_interval
    pace = runs.Pace(clock, device, ddp, c, budget, ckpt_every)   # when the clock is read: no sync at every step
    t_run = clock()
    with run, runs.Stop(ddp, master) as stop:
        while True:
            done = state.finished(c.max_iters, budget)
            stop_at = None if done else stop.pending   # a request at the last step changes nothing
            last = done or stop_at is not None
            # periodic duties (not counted in the time budget): eval, samples, checkpoint; not at a stop request's
            # step unless one is due there (stopping must fit a scheduler's grace period)
            if state.evaluation_due(c.eval_interval, done):
                fields = evaluate(state.step, state.elapsed)
                state.val_loss, state.val_step, samples = fields["val_loss"], state.step, fields.get("samples", [])
                run.record("eval", **fields)
            if state.checkpoint_due(ckpt_every, last, start_step):
                save_run(ckpt_path, raw, optimizer, loader, state, c, data, world, average)
            if last:
                break

            # one optimizer step: accum micro-steps, gradient sync only on the last one
            pace.step_started()
            lr = last_lr = scheduled_lr(c, state.step, state.elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1)
            loss_acc = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = batch or loader.next_batch(device)
                with model.no_sync() if ddp and micro < accum - 1 else contextlib.nullcontext():
                    with autocast:
                        loss = model(x, y) / accum
                    batch = loader.next_batch(device)   # the next micro-step's batch, read (and on CUDA its copy to
                    loss.backward()                     # the GPU issued) while the device runs this forward
                loss_acc += loss.detach()
            norm = gradient_clipping(raw.parameters(), c.grad_clip) if c.grad_clip > 0 else None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            average.update(state.step)   # --ema (else nothing)
            pace.step_ended(counted=not (hw["compile"] and state.step == start_step + 1))   # a compiled run's first
            # step is mostly compilation: not in the budget. The clock is read (a sync) only when Pace says so: then
            # the step times go into state.elapsed, agreed by the ranks (rank 0's clock, any rank's stop request)
            dt = pace.read(state, stop, master, device) if pace.due(state.step, stop) else None

            # the log line: every log_interval steps, and at the step the run ends (max_iters, budget, stop)
            if dt is not None and (state.step % c.log_interval == 0 or state.finished(c.max_iters, budget)
                                   or stop.pending is not None):
                if ddp:
                    torch.distributed.all_reduce(loss_acc)
                    loss_acc /= world
                train_loss, tps = loss_acc.item(), tokens_per_step / dt   # the one sync per logged step
                mfu = _mfu(flops_per_token, tps / world, device, hw["dtype"])
                gn = float(norm) if norm is not None else None   # (not computed with --grad_clip=0)
                left = state.time_left(c.max_iters, budget, pace.step_time)
                say(f"step {state.step:>6}/{c.max_iters} | loss {train_loss:.4f} | lr {lr:.2e} | " +
                    (f"norm {gn:.3f} | " if gn is not None else "") + f"{tps:,.0f} tok/s" +
                    (f" | mfu {100 * mfu:.1f}%" if mfu is not None else "") + f" | {runs.fmt_time(state.elapsed)}"
                    f" ({runs.fmt_time(left)} left)")
                run.record("train", step=state.step, loss=train_loss, lr=lr, grad_norm=gn, tokens_per_sec=tps,
                           mfu=mfu, dt=dt, elapsed=state.elapsed, time_left=left, tokens=state.step * tokens_per_step)
            if on_step is not None:
                on_step(state.step)
    if ddp and teardown:
        del model   # DDP and its reducer go before their process group: freed after it (on return), a compiled
        # run's rank 1 hung in the teardown ~1 run in 10 (gloo)
        torch.distributed.barrier()   # ranks tear gloo down together: one leaving early aborted its peer ~1 run in 20
        torch.distributed.destroy_process_group()
    stopped_by = stop_at or ("max_iters" if state.step >= c.max_iters else
                             f"time_budget={c.time_budget} (pass --time_budget= to train by steps only)")
    return dict(stopped_by=stopped_by, step=state.step, val_loss=state.val_loss, val_step=state.val_step,
                val_bpb=evaluate.bpb(state.val_loss), samples=samples, elapsed=state.elapsed,
                elapsed_this_run=state.elapsed - start_elapsed,
                lr=scheduled_lr(c, state.step, state.elapsed), last_lr=last_lr, ckpt=str(ckpt_path),
                log=str(run.log_path), params=n_params, wall=clock() - t_run, interrupted=stop_at is not None,
                world=world)


def _mfu(flops_per_token, tokens_per_sec, device, dtype):
    """The logged step's model FLOPs utilisation (flops.py), per process; None where the device's peak is unknown."""
    try:
        device = "cpu" if device.type == "cpu" else str(device)
        return flops.utilisation(flops_per_token * tokens_per_sec, device, dtype)
    except Exception:   # a GPU without a known peak: leave the column out
        return None


# -----------------------------------------------------------------------------
# the periodic evaluation train() runs (the pieces above train(): the loss, bits/byte, samples; here, when and
# what: the tasks, the log line and record)

class Evaluator:
    """The periodic evaluation: validation loss and bits/byte on a fixed stretch of the validation data, HellaSwag
    and LAMBADA when asked (tasks: {name: (module, examples)}, loaded with the inputs), samples. Everything it
    needs is checked when it is made, before the run writes a log or a checkpoint."""

    def __init__(self, raw, data, c, device, autocast, rank, world, log, tasks, average):
        self.raw, self.data, self.c, self.device, self.autocast, self.rank, self.world, self.log = (
            raw, data, c, device, autocast, rank, world, log)
        self.average = average   # under --ema the evaluations score the weight average
        need = c.batch_size * c.context_length * world
        runs.check_batch_fits(data.val, need + 1, "validation data")
        # the loss is read from the first validation file that holds a batch (shorter ones are skipped)
        path, scored = next((p, a) for p, a, _ in data.val if len(a) >= need + 1)
        if c.eval_tokens:   # exactly these tokens at any batch size or world size (a multiple: check_config)
            if c.eval_tokens + 1 > len(scored):
                raise ValueError(f"--eval_tokens={c.eval_tokens:,}: the validation file scored, {path}, holds only "
                                 f"{len(scored) - 1:,} targets")
            self.iters = c.eval_tokens // need
        else:
            self.iters = max(1, min(c.eval_iters, (len(scored) - 1) // need))
        tok = data.tokenizer   # bits per byte: the UTF-8 bytes of exactly the tokens scored
        self.bpt = None if tok is None else bytes_per_token(tok, scored[1:self.iters * need + 1], data.eot_id)
        self.tasks, self.said_skipped = tasks, set()
        if tok is not None and c.num_samples > 0 and c.sample_prompt:
            n = len(tok.encode(c.sample_prompt))
            if n > raw.context_length:
                log(f"train.py: --sample_prompt is {n} tokens, the context is {raw.context_length}: the samples keep "
                    f"its last {raw.context_length}")

    def bpb(self, val_loss):
        return val_loss / math.log(2) / self.bpt if (self.bpt and val_loss is not None) else None

    def __call__(self, step, elapsed):
        """Evaluate now: prints a line, returns the log record's fields (and the samples, on rank 0). Under --ema
        the weight average is evaluated; under --fsdp the whole model, gathered for the evaluation (whole_model,
        with the FSDP pieces after train())."""
        with self.average.swapped_in(), whole_model(self.raw):
            return self._evaluate(step, elapsed)

    def _evaluate(self, step, elapsed):
        c, raw = self.c, self.raw
        val_loss = estimate_val_loss(raw, self.data.val, c, raw.model_config()["arch"], self.device, self.autocast,
                                     self.rank, self.world, self.iters)
        fields = dict(step=step, val_loss=val_loss, val_bpb=self.bpb(val_loss), elapsed=elapsed)
        line = f"step {step:>6} | val loss {val_loss:.4f}" + (f" | val bpb {fields['val_bpb']:.4f}" if self.bpt else "")
        if res := self._task("hellaswag"):   # per token (build-nanogpt's figure) and per character (lm-eval's)
            fields.update(hellaswag_acc_norm=res["acc_norm"], hellaswag_acc_norm_char=res["acc_norm_char"])
            line += f" | hellaswag {res['acc_norm']:.4f} (per char {res['acc_norm_char']:.4f})"
        if res := self._task("lambada"):
            fields.update(lambada_acc=res["acc"], lambada_ppl=res["ppl"])
            line += f" | lambada {res['acc']:.4f} ppl {res['ppl']:.1f}"
        self.log(line)
        if self.rank == 0 and self.data.tokenizer is not None and c.num_samples > 0:
            fields["samples"] = generate_samples(raw, self.data.tokenizer, c, self.device, self.autocast, c.seed + step)
            for s in fields["samples"]:
                self.log(f"  sample: {s!r}")
        return fields

    def _task(self, name):
        """A downstream task's result, or None when it is not asked for or no example fits the model's context.
        The examples it cannot score (an ending or target longer than the context) are said once: the context
        never changes, so neither does their number, and the figures are over the others only."""
        if name not in self.tasks:
            return None
        lib, examples = self.tasks[name]
        with self.autocast:
            res = lib.evaluate(self.raw, self.data.tokenizer, examples, self.device, self.rank, self.world)
        if res["num_skipped"] and name not in self.said_skipped:
            self.said_skipped.add(name)
            scored = f"its figures are over the other {res['num_total']}" if res["num_total"] else "it is not scored"
            self.log(f"train.py: {'HellaSwag' if name == 'hellaswag' else 'LAMBADA'}: {res['num_skipped']} of "
                     f"{res['num_skipped'] + res['num_total']} examples do not fit the model's context "
                     f"({self.raw.context_length} tokens): {scored}")
        return res if res["num_total"] else None


# -----------------------------------------------------------------------------
# set-up that train() calls by name: what the run reads, resume, processes, device, precision

def resume_checkpoint(resume_from, c, ckpt_path, world):
    """The checkpoint this run continues (None: a new run), the same on every rank. main() read it for --resume=auto
    (under torchrun its error comes here instead, to be said by every rank), or --resume=true reads it now. Each
    rank reads its own --out_dir, so under torchrun the ranks agree (runs.agree) on whether they resume, at which
    step, and on their settings, before any other work: two nodes without a shared --out_dir would otherwise resume
    at step N on node 0 and start at step 0 on node 1, their evaluations and checkpoints never lining up."""
    ckpt, error = (None, resume_from) if isinstance(resume_from, Exception) else (resume_from, None)
    if ckpt is None and error is None and _parse_bool(c.resume) is True and not c.fresh:
        try:
            ckpt = runs.read_train_checkpoint(ckpt_path, run=True)
        except ValueError as e:
            error = e
    flags = settings()   # (a path may differ between nodes: a copy of the data elsewhere)
    runs.agree(world, error, {"the checkpoint resumed":
                              None if ckpt is None else f"step {ckpt['iteration']}, {ckpt['elapsed']:.6g} s trained",
                              **{f"--{k}": v for k, v in c.items() if k in flags and
                                 not flags[k][0].metadata.get("path")}})
    return ckpt


def open_inputs(c, ckpt, ckpt_path, world, log):
    """The token files and their tokenizer (runs.open_data), checked against the checkpoint resumed (--resume=auto
    continues only the same run), and the downstream tasks' examples: what each rank reads from its own disk or the
    network, agreed by the ranks (runs.agree) before any collective, so that a rank whose tokenizer or task file
    did not load never skips an evaluation that the others wait in. Returns (data, tasks)."""
    data = tasks = error = None
    try:
        data = runs.open_data(c, PREPARE_COMMANDS, {k: p["data_dir"] for k, p in PRESETS.items()}, log)
        if ckpt is not None:   # --resume=auto: out_dir must hold this run, trained on this data
            runs.check_same_run(ckpt, data, c, ckpt_path)
        tasks = task_examples(c, data, log)
    except (ValueError, OSError) as e:
        error = e
    tokenizer = ("loaded" if data is None or data.tokenizer is not None else
                 f"not loaded ({data.tokenizer_error})" if data.tokenizer_error else "none named")
    runs.agree(world, error, None if error else {
        "the training files": data.train_files,
        "the validation files": [[Path(p).name, len(a)] for p, a, _ in data.val],
        "the tokenizer": f"{tokenizer}, fingerprint {data.fingerprint}",
        "the downstream tasks' examples": {name: len(examples) for name, (_, examples) in tasks.items()}})
    return data, tasks


def task_examples(c, data, log):
    """{name: (module, examples)} of the downstream tasks asked for (--hellaswag, --lambada), scored with the data's
    tokenizer: none without one."""
    if data.tokenizer is None and (c.hellaswag or c.lambada):
        log("train.py: the data names no tokenizer that loads: no HellaSwag or LAMBADA evaluation")
    tasks = {}
    for name, lib in (("hellaswag", hellaswag), ("lambada", lambada)):
        if c[name] and data.tokenizer is not None:
            path = c[f"{name}_path"]
            try:
                tasks[name] = lib, lib.load_examples(path or None)
            except (ValueError, RuntimeError) as e:  # a missing or malformed file, or offline without a local copy
                raise ValueError(f"--{name}_path: {e}" if path else f"--{name}: {e}") from None
    return tasks


# -----------------------------------------------------------------------------
# processes, device, precision

def torchrun_rank(device):
    """(rank, local_rank, world_size, device, backend) of a process torchrun started, from its RANK, LOCAL_RANK and
    WORLD_SIZE: on CUDA the process takes the GPU of its LOCAL_RANK (model.rank_gpu: on a second node of 8 GPUs RANK 9
    is LOCAL_RANK 1, cuda:1) and NCCL; elsewhere gloo."""
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(device)
    if device.type == "cuda":
        device = model_lib.rank_gpu(local_rank)
    return rank, local_rank, world, device, "nccl" if device.type == "cuda" else "gloo"


def init_processes(c):
    """(rank, world_size, device): one process, or this rank of torchrun's (its process group started)."""
    device = model_lib.resolve_device(c.device)
    if c.num_threads:
        torch.set_num_threads(c.num_threads)
    rank, world = 0, 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rank, _, world, device, backend = torchrun_rank(device)
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend=backend)
    if device.type == "cuda" and device.index is not None:   # a rank's GPU or --device=cuda:N: synchronize(),
        torch.cuda.set_device(device)                          # pin_memory(), bf16 support and NCCL use this one
    return rank, world, device


def _auto(value, when_auto):
    """Resolve a true/false/auto setting."""
    value = _parse_bool(value)
    return when_auto if value == "auto" else value


# --dtype=auto on a CPU with native bf16: bfloat16 from this width on; below it the casts autocast adds cost more
# than the narrow matmuls save (AVX512-BF16, 2 cores: 1.07x at d128 (the main job), 1.2-1.4x at d96, 0.77x at d64;
# docs/BENCHMARKS.md, "bf16 on CPU")
CPU_BF16_MIN_D_MODEL = 96


def auto_dtype(c, device):
    """(dtype, why) that --dtype=auto comes to: bfloat16 on a GPU with native bf16, and on a CPU with native bf16
    for a model at least CPU_BF16_MIN_D_MODEL wide; float32 elsewhere (bf16 emulated is slower, not faster)."""
    kind = "GPU" if device.type == "cuda" else "CPU"
    if not model_lib.native_bf16(device):
        return "float32", f"auto: no native bf16 on this {kind}"
    width = model_lib.HUB_SHAPES.get(c["init_from"], (c["d_model"],))[-1]   # released GPT-2 weights bring their own
    if device.type == "cpu" and width < CPU_BF16_MIN_D_MODEL:
        return "float32", f"auto: d_model {width} < {CPU_BF16_MIN_D_MODEL}, too narrow for CPU bf16 to pay"
    return "bfloat16", f"auto: native bf16 on this {kind}"


def device_settings(c, device):
    """What --tf32, --dtype, --pad_vocab, --fused and --compile come to on `device`: "auto" turns each on for a CUDA
    device and off elsewhere; --dtype=auto is auto_dtype's choice. Returns dict(tf32, dtype (a name), dtype_why,
    pad_vocab (the multiple), fused, compile); fused is torch's fused AdamW, so never with --optimizer=muon. c: the
    settings by name (a dict)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    dtype, why = auto_dtype(c, device) if c["dtype"] == "auto" else (c["dtype"], "given")
    return dict(tf32=_auto(c["tf32"], cuda), dtype=dtype, dtype_why=why,
                pad_vocab=64 if _auto(c["pad_vocab"], cuda) else 1,
                fused=_auto(c["fused"], cuda) and c["optimizer"] == "adamw", compile=_auto(c["compile"], cuda))


def precision(c, device, world=1):
    """The run's numerics, decided in one place: (device_settings, the autocast context for the forwards). Under
    FSDP on a GPU, bfloat16 is FSDP's mixed-precision policy instead of autocast (see parallelize)."""
    hw = device_settings(c, device)
    if hw["tf32"]:
        torch.set_float32_matmul_precision("high")
    if c.deterministic:   # (cuBLAS reads its workspace setting at its first call: before any matmul)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    bf16 = hw["dtype"] == "bfloat16" and not fsdp_casts(c, device, world)
    return hw, torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


# -----------------------------------------------------------------------------
# past one GPU's memory: FSDP, activation checkpointing, sharded checkpoints. What --fsdp and
# --activation_checkpointing add, in a few functions that a reader of the loop can skip, as DDP's lines

# Under --fsdp every parameter, gradient and optimizer state is a DTensor: each rank holds a shard (rows) of it.
# Elementwise updates (AdamW, clipping's scaling) run on the local shards; the global gradient norm sums the shards'
# squares over the ranks; Muon all-gathers each matrix (see README: Past one GPU).

def sharded(t):
    """Whether t is a DTensor (FSDP's shards). Its module loads only in runs that shard (importing it takes ~1.7 s)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def local(t):
    """This rank's shard of a DTensor, which in-place updates change; any other tensor as it is. (DTensor's own
    elementwise ops give the same numbers at a dispatch cost per op.)"""
    return t.to_local() if sharded(t) else t


def whole(t):
    """The whole of a DTensor, all-gathered from the ranks' shards; any other tensor as it is."""
    return t.full_tensor() if sharded(t) else t


def shard_like(t, p):
    """This rank's shard of a whole tensor t laid out as the DTensor p is (a slice: no communication); t for a
    plain p."""
    if not sharded(p):
        return t
    from torch.distributed.tensor import DTensor, Replicate
    return DTensor.from_local(t, p.device_mesh, [Replicate()], run_check=False).redistribute(p.device_mesh,
                                                                                           p.placements)


def parallelize(raw, c, world, device, hw):
    """--activation_checkpointing and --fsdp, applied in place to the bare model before its optimizer is made.
    Checkpointing: each block's forward runs under torch.utils.checkpoint (non-reentrant), which keeps the block's
    input and recomputes the rest in the backward: the same ops on the same values, so the same numbers. FSDP2
    (PyTorch's fully_shard, torchtitan's engine): each block is a unit whose weights are all-gathered just before its
    forward and its backward and freed after them, and whose gradients are reduce-scattered; then the model itself
    (embeddings, final norm, head: GPT-2's tied wte/lm_head is one Parameter, sharded once there). On a GPU in
    bfloat16, FSDP's mixed-precision policy replaces autocast: bfloat16 weights in the forward and backward, float32
    master weights, optimizer and gradient reduction."""
    if c.activation_checkpointing:
        for block in model_lib.blocks(raw):
            block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
    if c.fsdp and world > 1:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        bf16 = fsdp_casts(c, device, world) and hw["dtype"] == "bfloat16"
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else
                  MixedPrecisionPolicy())
        for block in model_lib.blocks(raw):
            fully_shard(block, mp_policy=policy)
        fully_shard(raw, mp_policy=policy)
        # GPT returns logits[..., :vocab_size], a view, which FSDP warns an in-place edit would break: none is made
        warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor")


def fsdp_casts(c, device, world):
    """Whether FSDP's mixed-precision policy, not autocast, gives this run its bfloat16: FSDP on CUDA."""
    return c.fsdp and world > 1 and torch.device(device).type == "cuda"


@contextlib.contextmanager
def whole_model(raw):
    """Under FSDP, an evaluation's weights: every rank all-gathers the whole model and keeps it through the
    evaluation, whose forwards then need no collectives (rank 0 samples alone; each rank scores its own share of a
    task's examples), and frees it after: DDP's memory for that time. Without FSDP, nothing."""
    if not sharded(next(raw.parameters())):
        yield
        return
    from torch.distributed.fsdp import FSDPModule
    units = [m for m in raw.modules() if isinstance(m, FSDPModule)]
    raw.set_reshard_after_forward(False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:   # every unit resharded, and the evaluation's forwards forgotten: FSDP orders the next backward's
        raw.reset_iter_state()   # all-gathers by the forwards before it, which differed between the ranks here
        raw.set_reshard_after_forward(True)                   # FSDP's defaults: the blocks free their weights after
        raw.set_reshard_after_forward(False, recurse=False)   # each forward, the root keeps its own for the backward


def save_sharded(path, raw, optimizer, iteration, world, trained=None, **run):
    """--fsdp's checkpoint. Every rank writes its shards of the weights (and of --ema's trained weights, trained:
    {name: DTensor}) and of the optimizer state with torch.distributed.checkpoint (DCP) into a new folder beside
    path; then rank 0 writes path itself, the run's state (the rest of what save_checkpoint stores, with every
    rank's RNGs and loader) naming that folder, through a temporary file renamed over path. That rename commits the
    checkpoint: a crash before it leaves the last one whole (RunDir removes the unnamed folder); after it, the
    folder of the last one is removed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    name = [f"{path.name}.shards-{iteration}-{time.time_ns()}"]
    if world > 1:
        torch.distributed.broadcast_object_list(name)   # one folder for every rank: rank 0's name
    shards = {"model": get_model_state_dict(raw)}
    if trained is not None:
        shards["trained_weights"] = trained
    groups = None
    if optimizer.state:   # (an optimizer that has not stepped has no state yet; DCP would make one up)
        opt = get_optimizer_state_dict(raw, optimizer)
        shards["optimizer"], groups = opt["state"], opt["param_groups"]   # tensors only: the rest in path
    try:
        with warnings.catch_warnings():   # (that one process writes alone, as meant)
            warnings.filterwarnings("ignore", "torch.distributed is")
            dcp.save(shards, checkpoint_id=path.parent / name[0], no_dist=world == 1)
    except dcp.api.CheckpointException as e:   # (a BaseException, on every rank: the first rank's error, a full disk
        raise next(iter(e.failures.values()))[0] from None   # say, is what save_run reports)
    if int(os.environ.get("RANK", "0")) == 0:
        save_atomically(dict(shards=name[0], model_config=raw.model_config(), iteration=int(iteration),
                             optimizer_groups=groups, **run), path)
        runs.remove_stale_shards(path)


# -----------------------------------------------------------------------------
# the command line: argparse from the settings, the checks, main()

def model_settings():
    """The model's flags: {flag: (field, architectures that have it)}, from model.py's config dataclasses (a field
    names its flag when it differs, e.g. GPTConfig.n_embd is --d_model; flag=None: set by train.py itself)."""
    out = {}
    for arch in model_lib.ARCHS:
        for f in fields(model_lib.config_class(arch)):
            flag = f.metadata.get("flag", f.name)
            if flag:
                out.setdefault(flag, (f, set()))[1].add(arch)
    return out


def settings():
    """Every flag: {name: (field, architectures it applies to)}, read when asked (a test may add a field)."""
    own = {f.name: (f, {f.metadata["arch"]} if "arch" in f.metadata else set(model_lib.ARCHS))
           for f in fields(TrainConfig)}
    return {**own, **model_settings()}


DEFAULTS = {name: f.default for name, (f, _) in settings().items()}


# Presets: the documented runs. Each value can still be overridden on the command line.
TINYSTORIES_MODEL = dict(model="llama", vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16,
                         d_ff=1344, rope_theta=10000.0)
RUN = dict(prepare_data=False, time_budget="")   # presets are step-counted runs on prepared data
SPEEDRUN = dict(model="llama", vocab_size=4096, context_length=256, d_model=96, num_layers=4, num_heads=3, d_ff=256,
                prepare_data=False, time_budget="5m", max_iters=1_000_000, warmup_iters=50_000, optimizer="muon",
                learning_rate=1e-2, min_lr_ratio=0.1, weight_decay=0.1, beta1=0.9, beta2=0.95,
                eval_interval=50, eval_tokens=16384, log_interval=10, ema=0.99)
PRESETS = {
    # CS336 baseline at 327,680,000 tokens = 128 x 10,000 x 256 (one GPU)
    "tinystories": dict(TINYSTORIES_MODEL, **RUN, data_dir="data/tinystories-10k", batch_size=128,
                        max_iters=10000, warmup_iters=200, learning_rate=1e-3, min_lr_ratio=0.1, weight_decay=0.1,
                        beta1=0.9, beta2=0.95, eval_interval=500, eval_iters=50, sampler="random"),
    # the same shape at 40,960,000 tokens = 32 x 5,000 x 256 (a laptop CPU; the reference reaches ~1.80)
    "tinystories-cpu": dict(TINYSTORIES_MODEL, **RUN, data_dir="data/tinystories-10k", batch_size=32,
                            max_iters=5000, warmup_iters=100, learning_rate=1e-3, min_lr_ratio=0.1,
                            weight_decay=0.1, beta1=0.9, beta2=0.95, eval_interval=500, eval_iters=50,
                            sampler="random"),
    # OpenWebText with a 32k tokenizer, the same model
    "owt": dict(TINYSTORIES_MODEL, **RUN, vocab_size=32000, data_dir="data/owt-32k", batch_size=128,
                max_iters=10000, warmup_iters=200, learning_rate=1e-3, min_lr_ratio=0.1, weight_decay=0.1,
                beta1=0.9, beta2=0.95, eval_interval=500, eval_iters=50, sampler="random", sample_prompt="The"),
    # build-nanogpt's GPT-2 124M reproduction on FineWeb-Edu 10B (8 GPUs: 64 x 1024 x 8 = 524,288 tokens/step), on
    # its token stream (the first epoch in stream order: fineweb.py keeps the documents as given), with its warmup
    # (step 0 at lr/715) and its checkpoints every 5,000 steps (~1.5 GB each; a stop signal writes one as well)
    "gpt2-124m": dict(RUN, model="gpt2", vocab_size=50257, context_length=1024, d_model=768, num_layers=12,
                      num_heads=12, data_dir="data/edu_fineweb10B", batch_size=64, total_batch_tokens=524288,
                      learning_rate=6e-4, min_lr_ratio=0.1, warmup_iters=715, warmup_from_one=True, max_iters=19073,
                      weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0, eval_interval=250, eval_iters=20,
                      ckpt_interval=5000, hellaswag=True, lambada=True, sampler="sequential",
                      shuffle_first_epoch=False, sample_prompt="Hello, I'm a language model,", sample_tokens=32,
                      num_samples=4),
    # GPT-2 XL (1.56B, OpenAI's shape: --model=gpt2, 48 x 1600, 25 heads, context 1024) on FineWeb-Edu 10B, past one
    # GPU's memory: FSDP and activation checkpointing on one 8-GPU node. Batch and learning rate from GPT-3's
    # Table 2.1 (Brown et al. 2020), the row nearest in size, GPT-3 XL at 1.3B (2.7B: the same batch, lr 1.6e-4):
    # 2^20 = 1,048,576 tokens a step (32 x 1024 x 4 accum x 8 GPUs), lr 2e-4; its warmup of 375M tokens (357 steps)
    # and 10B tokens (9,536 steps), decayed to 10%; a checkpoint every 1,000 steps (~50 min of 8 GPUs; each ~25 GB)
    # predicted memory per GPU at batch 32: 1.05 * 32 + 3.40 = 37.0 GB (largest batch 73 on 80 GB): `python flops.py
    # --model=gpt2-xl --arch=gpt2 --gpus=8 --fsdp --activation_checkpointing`
    "gpt2-xl": dict(RUN, model="gpt2", vocab_size=50257, context_length=1024, d_model=1600, num_layers=48,
                    num_heads=25, data_dir="data/edu_fineweb10B", batch_size=32, total_batch_tokens=1048576,
                    learning_rate=2e-4, min_lr_ratio=0.1, warmup_iters=357, max_iters=9536, weight_decay=0.1,
                    beta1=0.9, beta2=0.95, grad_clip=1.0, eval_interval=250, eval_iters=20, ckpt_interval=1000,
                    hellaswag=True, lambada=True, sampler="sequential", sample_prompt="Hello, I'm a language model,",
                    sample_tokens=32, num_samples=4, fsdp=True, activation_checkpointing=True),
    # the CPU speedrun (bench.py speedrun): the best recipe measured for 5 minutes of 2 CPU cores on the 2 MiB
    # TinyStories head at vocab 4096: Llama d96 x 4 (3x the steps of d256 x 4 in 5 min), Muon at lr 1e-2, batch 8,
    # compiled (batch 8 and compilation won at d256 and are within noise at d96; compilation is off the clock, as a
    # compiled run's first step always is), against overfitting (5 minutes are 4-10 passes over the text) weight
    # decay 0.5 (0.018-0.035 bits/byte below 0.1 at 0.3, 0.012 more at 0.5 tied; 0.8 worse) and the head tied to the
    # embedding (0.037-0.041 below untied, in bf16 and fp32), scored as the moving average of its weights (decay
    # 0.995: 0.008-0.017 below 0.99 at weight decay 0.5-0.3 on a Zen 4; 0.998 averages in too much of the run); the
    # schedule is on the clock (max_iters only bounds it: 5% warmup). Where the CPU computes bf16 natively, attention
    # from primitives and the loss in chunks (PRESETS_UNDER_CPU_BF16: a tenth more steps each)
    "speedrun-cpu": dict(SPEEDRUN, data_dir="data/speedrun-4k", batch_size=8, compile="true", weight_decay=0.5,
                         tie_embeddings=True, ema=0.995),
    # the CPU recipe on one GPU, all of TinyStories (not timed yet), without what the CPU run's 2 MiB of text needs
    # against overfitting (weight decay 0.5, the tied head, the average's decay 0.995 rather than 0.99)
    "speedrun-gpu": dict(SPEEDRUN, data_dir="data/tinystories-10k", vocab_size=10000, d_model=512, num_heads=16,
                         d_ff=1344, batch_size=64),
}
# what a preset changes where its run autocasts to bf16 on a CPU that computes it natively (--dtype=auto there, from
# d96 on): the speedrun's attention from primitives and its loss in chunks pay under bf16 (0.84-0.87x and 0.86-0.92x
# sdpa's and the plain loss's step time at d96, compiled, on a Zen 4) but not in float32 (1.0x and 0.98x), so on an
# AVX2-only CPU, or with --dtype=float32, the preset keeps sdpa and the plain loss (docs/BENCHMARKS.md)
PRESETS_UNDER_CPU_BF16 = {"speedrun-cpu": dict(attn_impl="scratch", chunked_loss=True)}
# the command that prepares each preset's data (printed when it is missing)
PREPARE_COMMANDS = {
    # all of TinyStories (official validation split kept apart), a 10k BPE trained on it, train.bin / val.bin
    "tinystories": "python fineweb.py --prepare_tinystories --corpus_bytes=0 --vocab_size=10000 "
                   "--out_dir=data/tinystories-10k",
    # OpenWebText streamed into shards, with a 32k BPE trained on its first 100 MB
    "owt": "python fineweb.py --dataset=openwebtext --vocab_size=32000 --out_dir=data/owt-32k",
    # FineWeb-Edu sample-10BT, GPT-2 tokenizer, 100M-token shards (build-nanogpt's layout)
    "gpt2-124m": "python fineweb.py --dataset=fineweb-edu --out_dir=data/edu_fineweb10B",
}
PREPARE_COMMANDS["tinystories-cpu"] = PREPARE_COMMANDS["speedrun-gpu"] = PREPARE_COMMANDS["tinystories"]
PREPARE_COMMANDS["gpt2-xl"] = PREPARE_COMMANDS["gpt2-124m"]
# the speedrun's data: fineweb.py fetches the TinyStories head into data/tinystories-head (the first 2 MiB of the train
# split, the first 1,000 validation stories; offline stories.py's, saying so), then a 4096 BPE trained on its training
# text encodes both, as bench.py speedrun does (--force: a chain cut short runs again as printed)
_HEAD, _SR = "data/tinystories-head", "data/speedrun-4k"
PREPARE_COMMANDS["speedrun-cpu"] = (
    f"python fineweb.py --tinystories_head && "
    f"python bpe.py --input {_HEAD}/train.txt --vocab 4096 --out {_SR}/tokenizer --force && "
    f"python bpe.py --encode {_HEAD}/train.txt --tokenizer {_SR}/tokenizer --out {_SR}/train.bin --force && "
    f"python bpe.py --encode {_HEAD}/valid.txt --tokenizer {_SR}/tokenizer --out {_SR}/val.bin --force")
for _name, _preset in PRESETS.items():   # each preset runs in its own folder, never over the main job's out/ckpt.pt
    _preset.setdefault("out_dir", f"out/{_name}")


def _parse_bool(s, allow_auto=True):
    if isinstance(s, bool):
        return s
    low = str(s).lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    if low == "auto" and allow_auto:
        return "auto"
    raise argparse.ArgumentTypeError(f"expected {'true/false/auto' if allow_auto else 'true/false'}, got {s!r}")


def _parse_switch(s):
    return _parse_bool(s, allow_auto=False)


def build_parser():
    p = argparse.ArgumentParser(description="Train a language model (see the module docstring for commands).",
                                allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups = {"run": p.add_argument_group("run (train.py's TrainConfig)"),
              "model": p.add_argument_group("model (model.py's TransformerLMConfig; GPTConfig for --model=gpt2)")}
    own = {f.name for f in fields(TrainConfig)}
    for name, (f, archs) in settings().items():
        g = groups["run" if name in own else "model"]
        help_text = (f.metadata.get("help", f.name)   # a plain dataclass field (no setting(...)): its name
                     + ("" if archs == set(model_lib.ARCHS) else f" [--model={'/'.join(archs)}]"))
        if isinstance(f.default, bool) or f.metadata.get("auto"):
            g.add_argument(f"--{name}", type=_parse_bool if f.metadata.get("auto") else _parse_switch, nargs="?",
                           const=True, default=f.default, help=help_text)
        else:   # a path's ~ is expanded here: the shell leaves --out_dir=~/runs as it is
            g.add_argument(f"--{name}", type=os.path.expanduser if f.metadata.get("path") else type(f.default),
                           default=f.default, help=help_text)
    bpe.one_line_errors(p)
    return p


def get_config(argv=None):
    """defaults <- preset <- flags given on the command line. Returns (config, names given explicitly)."""
    argv = list(argv or [])
    args = build_parser().parse_args(argv)
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    explicit = {k: v for k, v in vars(args).items() if k in given}
    return resolve_config(explicit), explicit


def resolve_config(overrides):
    cfg = {name: f.default for name, (f, _) in settings().items()}
    preset = overrides.get("preset", "")
    if preset:
        if preset not in PRESETS:
            raise SystemExit(f"train.py: --preset: unknown {preset!r}; choose from {', '.join(PRESETS)}")
        cfg.update(PRESETS[preset])
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}")
    cfg.update(overrides)
    if "data_dir" in overrides and "prepare_data" not in overrides:
        cfg["prepare_data"] = False   # a folder named on the command line is the user's: never filled with stories
    if preset in PRESETS_UNDER_CPU_BF16 and cpu_bf16(cfg):   # (a flag given still wins)
        cfg.update({k: v for k, v in PRESETS_UNDER_CPU_BF16[preset].items() if k not in overrides})
    return cfg


def cpu_bf16(cfg):
    """Whether a run of these settings autocasts to bfloat16 on a CPU (--device auto without a GPU, or cpu)."""
    if cfg["device"] not in ("auto", "cpu") or model_lib.resolve_device(cfg["device"]).type != "cpu":
        return False
    return device_settings(cfg, torch.device("cpu"))["dtype"] == "bfloat16"


def check_config(cfg):
    """The run's settings (cfg: every setting by name) as a Settings, once bad settings are refused before any work
    is done, naming the flag: each setting's own check and choices, the settings of the other architecture, and
    the few that depend on each other."""
    c = Settings(cfg)
    for name, (f, archs) in settings().items():
        model_lib.check_setting(f"--{name}", c.get(name, f.default), f)
    other = [f"--{name}={c[name]}" for name, (f, archs) in settings().items()
             if c["model"] not in archs and c.get(name, f.default) != f.default]
    if other:
        arch = "gpt2" if c.model == "llama" else "llama"
        raise ValueError(f"{', '.join(other)}: only for --model={arch} (pass the default with --model={c.model})")
    model_lib.check_heads(c.d_model, c.num_heads, rope=c.model == "llama" and not c.remove_rope)
    if c.prepare_data and c.vocab_size < 257:
        raise ValueError(f"--vocab_size must be >= 257 (256 bytes + <|endoftext|>) to train the tokenizer, "
                         f"got {c.vocab_size}")
    world = int(os.environ.get("WORLD_SIZE", "1"))   # (torchrun's: batch arithmetic is checked before data prep)
    grad_accum_steps(c.total_batch_tokens, c.batch_size, c.context_length, world)
    if c.eval_tokens % (c.batch_size * c.context_length * world):
        raise ValueError(f"--eval_tokens={c.eval_tokens:,} is not a multiple of batch_size*context_length"
                         f"*world_size = {c.batch_size * c.context_length * world:,}: pick one, so that every run "
                         f"scores the same tokens")
    if not str(c.data_dir).strip():   # (Path("") is the current folder)
        raise ValueError("--data_dir '': empty; expected the folder of the token files")
    runs.check_output_paths(c)
    if c.time_budget and not 0 < runs.parse_duration(c.time_budget) < math.inf:
        raise ValueError(f"--time_budget must be > 0 and finite ('' = none), got {c.time_budget!r}")
    # an unknown backend would be a traceback at step 1; listing them imports torch._dynamo (~1.4 s of start-up on
    # CPU), so the default one, always there, is not looked up
    if c.compile_backend != DEFAULTS["compile_backend"] and c.compile_backend not in torch.compiler.list_backends(
            exclude_tags=()):
        raise ValueError(f"--compile_backend: expected a torch.compile backend (inductor, aot_eager, ...: see "
                         f"torch.compiler.list_backends()), got {c.compile_backend!r}")
    return c


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg, explicit = get_config(argv)
    t0 = time.time()
    try:
        if cfg["plot"]:
            for p in runs.plot_log(cfg["plot"]):
                print(f"wrote {p}")
            return
        for name in explicit:   # a bad value is named as such before a checkpoint is compared with the run
            model_lib.check_setting(f"--{name}", cfg[name], settings()[name][0])
        resumable = {f.name for f in fields(TrainConfig) if f.metadata.get("resumable")}
        try:
            cfg, ckpt = runs.resume_settings(dict(cfg, resume=_parse_bool(cfg["resume"])), explicit, DEFAULTS,
                                             PRESETS, resumable)
        except ValueError as e:   # under torchrun every rank must hear of it: train() agrees on it first
            if int(os.environ.get("WORLD_SIZE", "1")) == 1:
                raise
            cfg, ckpt = dict(cfg, resume=_parse_bool(cfg["resume"])), e
        summary = train(cfg, resume_from=ckpt)
    except runs.AgreedError as e:   # under torchrun, the same line on every rank: said once, by rank 0
        raise SystemExit(f"train.py: {e}" if int(os.environ.get("RANK", "0")) == 0 else 1) from None
    except (ValueError, OSError) as e:   # OSError: an --out_dir that is a file, a full disk, ...
        raise SystemExit(f"train.py: {e}") from None
    except KeyboardInterrupt:   # before the loop's own Ctrl-C handling starts, or a second Ctrl-C inside it
        print("\ntrain.py: interrupted; nothing written since the last checkpoint", file=sys.stderr)
        raise SystemExit(130) from None
    if int(os.environ.get("RANK", "0")) == 0:
        print_summary(summary, time.time() - t0, main_job=not cfg["preset"] and cfg["data_dir"] == DEFAULTS["data_dir"])
    if summary["interrupted"]:
        raise SystemExit(130)  # checkpointed, but cut short: scripts that run train.py must not take it as finished


def print_summary(s, wall, main_job):
    """The run's last lines: what it reached, where it is, the commands to go on with."""
    print()
    total = "" if s["elapsed_this_run"] == s["elapsed"] else f", {runs.fmt_time(s['elapsed'])} in all"
    # a stopped run is not evaluated at its stop (see DECISIONS.md): its last figures and sample are of an earlier
    # model (the untrained one, stopped before the first evaluation step), so they are not given as its result
    now = s["val_loss"] is not None and s["val_step"] == s["step"]
    print(f"done in {runs.fmt_time(wall)} (training {runs.fmt_time(s['elapsed_this_run'])}{total}), step {s['step']}"
          f" (stopped by {s['stopped_by']})"
          + (f" | val loss {s['val_loss']:.4f} nats/token" if now else "")
          + (f" | {s['val_bpb']:.4f} bits/byte" if now and s["val_bpb"] else "")
          + (f" | last evaluated at step {s['val_step']} (its figures are in the log)"
             if s["val_loss"] is not None and not now else ""))
    if s["samples"] and now:
        print(f"sample: {s['samples'][0]}")
    print(f"checkpoint: {s['ckpt']}   log: {s['log']}")
    out_dir, q = Path(s["ckpt"]).parent, shlex.quote   # (quoted: a path with a space pastes as one argument)
    steps = [(f"python sample.py{'' if out_dir == Path('out') else ' ' + q('--ckpt=' + s['ckpt'])} --top_p 0.9",
              "more samples from this model"),
             (f"python train.py {q('--plot=' + s['log'])}", "loss curves as PNG")]
    if s["interrupted"]:   # continued by as many processes as wrote the checkpoint (DDP's loaders need it)
        world, local = s["world"], int(os.environ.get("LOCAL_WORLD_SIZE", s["world"]))
        launch = ("python" if world == 1 else f"torchrun --standalone --nproc_per_node={world}" if local == world
                  else f"torchrun --nnodes={world // local} --nproc_per_node={local}")   # (+ the rendezvous flags)
        where = "" if out_dir == Path("out") else " " + q(f"--out_dir={out_dir}")
        steps.insert(0, (f"{launch} train.py --resume{where}",
                         "continue from the checkpoint" + (", on every node" if local != world else "")))
    if main_job:
        steps.append(("python train.py --preset=tinystories-cpu", "the CS336 baseline shape, once its data exists:"))
    width = max(len(cmd) for cmd, _ in steps)
    print("next:")
    for cmd, why in steps:
        print(f"  {cmd:<{width}}  # {why}")
    if main_job:
        print(f"      {PREPARE_COMMANDS['tinystories-cpu']}")


if __name__ == "__main__":
    main()
