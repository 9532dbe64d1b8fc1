"""
Train a language model: AdamW, warmup + cosine, clipping, memmapped token data, exact-resume checkpoints, and
one loop that runs from a laptop CPU to torchrun on a GPU node.

    python train.py                                    # the main job (offline, ~3-4 min on 2 CPU cores): stories ->
                                                       #   BPE -> token files -> 1.3M-param Llama for 2.5 min -> sample
    python train.py --fresh                            # the same, starting over instead of reusing what exists
    python train.py --preset=tinystories-cpu           # CS336 TinyStories baseline shape, 40.96M tokens (CPU)
    python train.py --preset=tinystories               # the same model, 327.68M tokens (one GPU)
    python train.py --preset=owt                       # OpenWebText, 32k tokenizer, same model
    torchrun --standalone --nproc_per_node=8 train.py --preset=gpt2-124m     # GPT-2 124M on FineWeb-Edu 10B
    python train.py --model=gpt2 --init_from=gpt2 --data_dir=data/mydata --out_dir=out/ft   # fine-tune GPT-2
    python train.py --preset=owt --time_budget=45m     # a fixed wall-clock run: the schedule follows the clock
    python train.py --resume                           # continue out/ckpt.pt exactly where it stopped
    python train.py --plot=out/log.jsonl               # loss vs steps / vs wall clock PNGs next to the log
    python train.py --help                             # every setting below, with its default

Two nodes (run on each node, node_rank 0 and 1; master = the first node's address):
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 train.py ...

Every name in the CONFIG block is a flag (`--name=value`); a preset changes a few of them (and writes to
out/PRESET) and any flag still overrides it. Only rank 0 prints, logs and writes checkpoints. Ctrl-C or SIGTERM
(a scheduler's preemption notice; under torchrun, to any rank) finishes the current step on every rank, writes a
checkpoint and stops; `--resume` then continues bit for bit (on CPU) as if nothing happened.
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import random
import shlex
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import bpe
import fineweb
import flops
import hellaswag
import lambada
import model as model_lib
from sample import generate

# -----------------------------------------------------------------------------
# configuration: (name, default, help). argparse is generated from this block.
# "auto" means: on where the hardware supports it (CUDA), off elsewhere.

CONFIG = [
    # I/O
    ("out_dir", "out", "folder for ckpt.pt, log.jsonl and plots (a preset's default: out/PRESET)"),
    ("data_dir", "data/tinystories", "folder with train*.bin / val*.bin token files (each with a .bin.json sidecar)"),
    ("prepare_data", True, "build data_dir with fineweb.prepare_tinystories first (downloads or generates stories; reused "
                           "when done); off when --data_dir is given, unless also given"),
    ("corpus_bytes", 4_000_000, "with --prepare_data: bytes of TinyStories (or generated stories) to prepare"),
    ("download", True, "with --prepare_data: try TinyStories from the Hugging Face hub before generating stories"),
    ("preset", "", "tinystories | tinystories-cpu | owt | gpt2-124m (sets the documented values; flags still override)"),
    ("resume", "auto", "continue out_dir/ckpt.pt: auto = when it exists (one from other settings stops the run: use --fresh), true = must, false = never"),
    ("fresh", False, "start over: replace out_dir's checkpoint and log (and re-prepare the data of the main job)"),
    ("init_from", "scratch", "scratch, or gpt2 | gpt2-medium | gpt2-large | gpt2-xl (released weights) or a local "
                             "Hugging Face GPT-2 folder (--model=gpt2)"),
    ("plot", "", "path of a log.jsonl: draw loss-vs-steps and loss-vs-time PNGs beside it and exit"),
    ("wandb", False, "also log to Weights & Biases (only if wandb is installed)"),
    ("wandb_project", "lmscratch", "wandb project name"),
    # model
    ("model", "llama", "llama (TransformerLM, CS336 naming) or gpt2 (GPT, nanoGPT naming)"),
    ("vocab_size", 2048, "BPE size the data preparation trains; the model always uses the data's vocabulary"),
    ("context_length", 128, "tokens per training window (GPT-2: block_size)"),
    ("d_model", 128, "width (GPT-2: n_embd)"),
    ("num_layers", 4, "Transformer blocks (GPT-2: n_layer)"),
    ("num_heads", 4, "attention heads (GPT-2: n_head)"),
    ("d_ff", 0, "Llama feed-forward width (0 = 8/3*d_model rounded to 64, at least 64, for swiglu; 4*d_model for silu)"),
    ("rope_theta", 10000.0, "Llama: RoPE base"),
    ("remove_rmsnorm", False, "Llama ablation: no RMSNorm anywhere"),
    ("use_post_norm", False, "Llama ablation: post-norm blocks"),
    ("remove_rope", False, "Llama ablation: no position information (NoPE)"),
    ("ffn_type", "swiglu", "Llama ablation: swiglu | silu"),
    ("attn_impl", "sdpa", "sdpa (F.scaled_dot_product_attention, flash on GPU) | scratch (the from-primitives path)"),
    ("pad_vocab", "auto", "GPT-2: pad the vocabulary to a multiple of 64 (auto = on CUDA)"),
    # data and batch
    ("sampler", "sequential", "sequential (shards in order, shuffled per epoch, rank strides) | random (CS336 windows)"),
    ("batch_size", 32, "sequences per micro-step per process"),
    ("total_batch_tokens", 0, "tokens per optimizer step (0 = batch_size*context_length*world); sets grad accumulation"),
    # optimizer and schedule
    ("learning_rate", 3e-3, "peak learning rate"),
    ("min_lr_ratio", 0.1, "the cosine ends at min_lr_ratio * learning_rate"),
    ("warmup_iters", 50, "linear warmup steps"),
    ("max_iters", 1000, "optimizer steps (the run ends at max_iters or when --time_budget is spent, the first)"),
    ("lr_decay_iters", 0, "cosine length in steps (0 = max_iters)"),
    ("time_budget", "2.5m", "training time limit, e.g. 45m, 90s, 1.5h ('' = none); the schedule follows the clock"),
    ("weight_decay", 0.1, "AdamW decoupled weight decay (2-D weights only)"),
    ("beta1", 0.9, "AdamW beta1"),
    ("beta2", 0.95, "AdamW beta2"),
    ("eps", 1e-8, "AdamW epsilon"),
    ("grad_clip", 1.0, "clip the global gradient L2 norm to this (0 = off)"),
    ("fused", "auto", "use PyTorch's fused AdamW (auto = on CUDA); otherwise this file's AdamW"),
    # evaluation, logging, checkpoints
    ("eval_interval", 250, "evaluate (val loss, bits/byte, a sample) every N steps and at the end"),
    ("eval_iters", 10, "validation batches per evaluation"),
    ("eval_tokens", 0, "validation tokens per evaluation, a multiple of batch_size*context_length*world_size "
                       "(0 = eval_iters batches); the same number scores runs of any batch size on the same text"),
    ("log_interval", 10, "print a line every N steps (and at the step the run ends)"),
    ("ckpt_interval", 0, "write ckpt.pt every N steps (0 = at every evaluation); always at the end"),
    ("num_samples", 1, "samples generated at each evaluation"),
    ("sample_tokens", 64, "tokens per sample"),
    ("temperature", 0.8, "sampling temperature"),
    ("top_p", 0.9, "nucleus sampling threshold"),
    ("sample_prompt", "Once upon a time", "prompt for the samples"),
    ("hellaswag", False, "HellaSwag accuracy at each evaluation (needs hellaswag.py)"),
    ("hellaswag_path", "", "local HellaSwag jsonl (default: the official val set, downloaded once)"),
    ("lambada", False, "LAMBADA last-word accuracy and perplexity at each evaluation (needs lambada.py)"),
    ("lambada_path", "", "local LAMBADA jsonl (default: OpenAI's test set, downloaded once)"),
    # system
    ("device", "auto", "auto | cpu | cuda | cuda:N"),
    ("dtype", "auto", "autocast dtype: auto (bfloat16 on a CUDA GPU with native bf16, else float32) | float32 | bfloat16"),
    ("compile", "auto", "torch.compile the training module (auto = on CUDA); eval and sampling use the plain module"),
    ("compile_backend", "inductor", "torch.compile backend"),
    ("tf32", "auto", "TF32 matmuls on CUDA"),
    ("num_threads", 0, "torch CPU threads (0 = torch's default)"),
    ("seed", 1337, "seed for init, data order and sampling"),
]
DEFAULTS = {name: default for name, default, _ in CONFIG}

# Presets: the documented runs. Each value can still be overridden on the command line.
TINYSTORIES_MODEL = dict(model="llama", vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16,
                         d_ff=1344, rope_theta=10000.0)
RUN = dict(prepare_data=False, time_budget="")   # presets are step-counted runs on prepared data
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
    # build-nanogpt's GPT-2 124M reproduction on FineWeb-Edu 10B (8 GPUs: 64 x 1024 x 8 = 524,288 tokens/step)
    "gpt2-124m": dict(RUN, model="gpt2", vocab_size=50257, context_length=1024, d_model=768, num_layers=12, num_heads=12,
                      data_dir="data/edu_fineweb10B", batch_size=64, total_batch_tokens=524288,
                      learning_rate=6e-4, min_lr_ratio=0.1, warmup_iters=715, max_iters=19073, weight_decay=0.1,
                      beta1=0.9, beta2=0.95, grad_clip=1.0, eval_interval=250, eval_iters=20, hellaswag=True, lambada=True,
                      sampler="sequential", sample_prompt="Hello, I'm a language model,", sample_tokens=32,
                      num_samples=4),
}
# the command that prepares each preset's data (printed when it is missing)
PREPARE_COMMANDS = {
    # all of TinyStories (official validation split kept apart), a 10k BPE trained on it, train.bin / val.bin
    "tinystories": "python fineweb.py --prepare_tinystories --corpus_bytes=0 --vocab_size=10000 --out_dir=data/tinystories-10k",
    # OpenWebText streamed into shards, with a 32k BPE trained on its first 100 MB
    "owt": "python fineweb.py --dataset=openwebtext --vocab_size=32000 --out_dir=data/owt-32k",
    # FineWeb-Edu sample-10BT, GPT-2 tokenizer, 100M-token shards (build-nanogpt's layout)
    "gpt2-124m": "python fineweb.py --dataset=fineweb-edu --out_dir=data/edu_fineweb10B",
}
PREPARE_COMMANDS["tinystories-cpu"] = PREPARE_COMMANDS["tinystories"]
for _name, _preset in PRESETS.items():   # each preset runs in its own folder, never over the main job's out/ckpt.pt
    _preset.setdefault("out_dir", f"out/{_name}")
# settings that may change when a run is resumed (everything else must match the checkpoint)
RESUMABLE_CHANGES = {"out_dir", "resume", "fresh", "plot", "wandb", "wandb_project", "max_iters", "time_budget",
                     "eval_interval", "eval_iters", "eval_tokens", "log_interval", "ckpt_interval", "num_samples",
                     "sample_tokens", "temperature", "top_p", "sample_prompt", "hellaswag", "hellaswag_path", "lambada",
                     "lambada_path", "device", "compile", "compile_backend", "num_threads", "prepare_data", "download",
                     "preset", "lr_decay_iters", "fused", "data_dir"}   # data_dir: a moved copy of the same files


# -----------------------------------------------------------------------------
# optimizer, schedule, clipping (from primitives)

class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019) with the same arithmetic and state names as torch.optim.AdamW.
    lr and weight_decay are read from each param group at every step, so a schedule just writes group["lr"]."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or weight_decay < 0:
            raise ValueError(f"AdamW: invalid hyperparameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)   # a tensor, like torch's, so state dicts interchange
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                t = state["step"].item()
                p.mul_(1 - lr * wd)                          # decoupled weight decay, before the Adam update
                m.lerp_(g, 1 - beta1)                        # m = beta1 m + (1 - beta1) g
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                bias1 = 1 - beta1 ** t
                bias2 = 1 - beta2 ** t
                denom = (v.sqrt() / bias2 ** 0.5).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bias1)
        return loss


def get_lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters):
    """Linear warmup to max over warmup_iters, cosine down to min at cosine_cycle_iters, then flat at min."""
    if it < warmup_iters:
        return max_learning_rate * it / warmup_iters
    if it >= cosine_cycle_iters:
        return min_learning_rate
    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
    return min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (max_learning_rate - min_learning_rate)


def scheduled_lr(cfg, step, elapsed):
    """A run's learning rate at `step` after `elapsed` seconds of training. Under --time_budget the schedule follows
    whichever is further along, steps or the clock (elapsed time mapped onto the step axis 0..max_iters), so with
    the default lr_decay_iters (= max_iters) it ends when the budget does."""
    budget = parse_duration(cfg["time_budget"]) if cfg["time_budget"] else None
    it = step if budget is None else max(step, min(elapsed / budget, 1.0) * cfg["max_iters"])
    return get_lr_cosine_schedule(it, cfg["learning_rate"], cfg["learning_rate"] * cfg["min_lr_ratio"],
                                  cfg["warmup_iters"], cfg["lr_decay_iters"] or cfg["max_iters"])


@torch.no_grad()
def gradient_clipping(parameters, max_l2_norm, eps=1e-6):
    """Scale all gradients in place so their global L2 norm is at most max_l2_norm; returns the pre-clip norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    scale = torch.clamp(max_l2_norm / (norm + eps), max=1.0)   # no .item(): no GPU sync on the hot path
    for g in grads:
        g.mul_(scale.to(g.dtype))
    return norm


# -----------------------------------------------------------------------------
# token files and data loading

def load_tokens(path):
    """Memmap a token file X.bin after checking its sidecar X.bin.json; returns (array, meta)."""
    path = Path(path)
    side = Path(str(path) + ".json")
    if not path.is_file():
        raise ValueError(f"{path}: token file not found")
    try:
        meta = json.loads(side.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing sidecar {side.name} (write token files with bpe.py --encode or fineweb.py)")
    except json.JSONDecodeError as e:
        raise ValueError(f"{side}: not valid JSON ({e})")
    if not isinstance(meta, dict):
        raise ValueError(f"{side}: expected a JSON object (the token file's format, dtype, vocab_size ...)")
    if meta.get("format") != "tokens-v1" or meta.get("dtype") not in ("uint16", "uint32"):
        raise ValueError(f"{side}: expected format tokens-v1 with dtype uint16|uint32, got "
                         f"{meta.get('format')!r}/{meta.get('dtype')!r}")
    dtype = np.dtype(meta["dtype"])
    size = path.stat().st_size
    if size % dtype.itemsize or size // dtype.itemsize != meta.get("num_tokens"):
        raise ValueError(f"{path}: {size} bytes but the sidecar says {meta.get('num_tokens')} {meta['dtype']} "
                         f"tokens (truncated or corrupt file?)")
    if size == 0:
        raise ValueError(f"{path}: empty token file")
    return np.memmap(path, dtype=dtype, mode="r"), meta


def check_token_range(arr, vocab_size, path, chunk=1 << 24, max_scan=2_000_000_000):
    """A token id >= vocab_size would index past the embedding: refuse before training starts.
    Files up to max_scan tokens are scanned in full (GB/s); beyond that the sidecar's vocab_size is trusted."""
    n = min(len(arr), max_scan)
    top = max(int(arr[i:i + chunk].max()) for i in range(0, n, chunk))
    if top >= vocab_size:
        raise ValueError(f"{path}: token id {top} >= the model's vocab_size {vocab_size}")


def find_shards(data_dir, split):
    files = sorted(Path(data_dir).glob(f"{split}*.bin"))
    return [(str(f), *load_tokens(f)) for f in files]


def get_batch(dataset, batch_size, context_length, device, rng=None):
    """Random windows (CS336): x = dataset[s:s+T], y = dataset[s+1:s+T+1] for random s in [0, len-T-1]."""
    high = len(dataset) - context_length   # exclusive bound, so the largest start is len - T - 1
    if high < 1:
        raise ValueError(f"get_batch: {len(dataset)} tokens is too few for context_length {context_length}")
    starts = rng.integers(0, high, size=batch_size) if rng is not None else np.random.randint(0, high, size=batch_size)
    buf = np.stack([dataset[s:s + context_length + 1] for s in starts]).astype(np.int64)
    return _to_device(torch.from_numpy(buf), device)


def _to_device(buf, device):
    """(B, T+1) int64 CPU tensor -> x, y on device (pinned + async copy on CUDA)."""
    device = torch.device(device)
    if device.type == "cuda":
        buf = buf.pin_memory().to(device, non_blocking=True)
    else:
        buf = buf.to(device)
    return buf[:, :-1], buf[:, 1:]


class RandomSampler:
    """CS336-style random windows; with several shards, each row picks a shard in proportion to its size.
    Its RNG state is the whole loader position."""

    def __init__(self, shards, batch_size, context_length, seed=0, rank=0):
        self.arrays = [a for _, a, _ in shards if len(a) >= context_length + 1]
        if not self.arrays:
            raise ValueError(f"no token file has context_length+1 = {context_length + 1} tokens")
        self.B, self.T = batch_size, context_length
        sizes = np.array([len(a) - context_length for a in self.arrays], dtype=np.float64)
        self.p = sizes / sizes.sum()
        self.rng = np.random.default_rng([seed, rank])

    def next_batch(self, device):
        if len(self.arrays) == 1:
            return get_batch(self.arrays[0], self.B, self.T, device, rng=self.rng)
        which = self.rng.choice(len(self.arrays), size=self.B, p=self.p)
        rows = []
        for i in which:
            s = self.rng.integers(0, len(self.arrays[i]) - self.T)
            rows.append(self.arrays[i][s:s + self.T + 1])
        return _to_device(torch.from_numpy(np.stack(rows).astype(np.int64)), device)

    def state_dict(self):
        return {"kind": "random", "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]


def check_batch_fits(shards, need, what="training data"):
    """One batch of need tokens must fit in some shard ((path, array, ...) tuples): else name the longest one."""
    path, arr = max(shards, key=lambda s: len(s[1]))[:2]
    if len(arr) < need:
        raise ValueError(f"{what} too short: {path} has {len(arr):,} tokens"
                         f"{f' (the longest of {len(shards)} files)' if len(shards) > 1 else ''}, one batch needs "
                         f"batch_size*context_length*world_size+1 = {need:,}")


class SequentialSampler:
    """build-nanogpt-style reading: windows of B*T+1 tokens taken in order through the shards, rank r of W taking
    every W-th window. Unlike the reference, each epoch shuffles the shard order and, when the end-of-text id is
    known, the order of the documents inside each shard (documents are cut at every eot token; without one, the
    shard is rotated to a random start instead), with an RNG seeded by (seed, epoch): the position (epoch, shard,
    offset) pins the data exactly, for resume."""

    def __init__(self, shards, batch_size, context_length, rank=0, world_size=1, seed=0, eot_id=None, shuffle=True):
        self.shards = [(p, a) for p, a, _ in shards]
        self.B, self.T, self.rank, self.world = batch_size, context_length, rank, world_size
        self.seed, self.eot_id, self.shuffle = seed, eot_id, shuffle
        self.span = batch_size * context_length   # tokens one rank consumes per batch
        check_batch_fits(self.shards, self.span * world_size + 1)
        self.epoch, self.shard, self.pos = 0, 0, 0
        self._start_epoch()

    def _start_epoch(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.order = rng.permutation(len(self.shards)) if self.shuffle else np.arange(len(self.shards))
        self.doc_seed = int(rng.integers(2 ** 62))
        self._load_shard()

    def _load_shard(self):
        arr = self.shards[self.order[self.shard]][1]
        self.arr = arr
        rng = np.random.default_rng([self.doc_seed, self.shard])
        starts = None
        if self.shuffle and self.eot_id is not None:
            cuts = np.flatnonzero(np.asarray(arr) == self.eot_id)
            starts = np.unique(np.concatenate([[0], cuts])).astype(np.int64)   # each piece begins at an eot
            # the shard may open mid-document (fineweb splits documents across shards): that piece stays first,
            # never glued after another one; the others move
            fixed = int(arr[0] != self.eot_id)
        if starts is not None and len(starts) - fixed > 1:
            lengths = np.diff(np.append(starts, len(arr)))
            perm = np.concatenate([np.arange(fixed), fixed + rng.permutation(len(starts) - fixed)])
            self.seg_start, self.seg_len = starts[perm], lengths[perm]
        elif self.shuffle:
            # no documents to reorder (no eot id, or a single document): rotate the shard to a random start
            # instead, so that no epoch repeats the last one's batches
            cut = int(rng.integers(len(arr)))
            self.seg_start, self.seg_len = np.array([cut, 0]), np.array([len(arr) - cut, cut])
        else:
            self.seg_start, self.seg_len = np.array([0]), np.array([len(arr)])
        self.seg_cum = np.concatenate([[0], np.cumsum(self.seg_len)])

    def _read(self, pos, n):
        """n tokens from position pos of the (document-shuffled) shard."""
        out, i = [], int(np.searchsorted(self.seg_cum, pos, side="right") - 1)
        while n > 0:
            off = pos - self.seg_cum[i]
            take = int(min(n, self.seg_len[i] - off))
            s = self.seg_start[i] + off
            out.append(self.arr[s:s + take])
            n, pos, i = n - take, pos + take, i + 1
        return np.concatenate(out) if len(out) > 1 else np.asarray(out[0])

    def next_batch(self, device):
        while self.pos + self.span * self.world + 1 > len(self.arr):   # this shard is used up
            self.shard += 1
            self.pos = 0
            if self.shard == len(self.shards):
                self.epoch, self.shard = self.epoch + 1, 0
                self._start_epoch()
            else:
                self._load_shard()
        buf = self._read(self.pos + self.rank * self.span, self.span + 1).astype(np.int64)
        self.pos += self.span * self.world
        rows = torch.from_numpy(np.lib.stride_tricks.sliding_window_view(buf, self.T + 1)[::self.T].copy())
        return _to_device(rows, device)

    def state_dict(self):
        return {"kind": "sequential", "epoch": self.epoch, "shard": self.shard, "pos": self.pos}

    def load_state_dict(self, state):
        self.epoch, self.shard = state["epoch"], 0
        self._start_epoch()
        self.shard, self.pos = state["shard"], state["pos"]
        self._load_shard()


class LossOf(nn.Module):
    """The module train.py compiles and wraps in DDP: (x, y) -> mean next-token loss, so the loss is inside the
    compiled graph for both models. TransformerLM.forward returns logits: compiling it alone left Llama's
    cross-entropy over the (tokens, vocab) logits eager, 387k against 472k tok/s at the GPT-2 124M shape on an H200."""

    def __init__(self, model, arch):
        super().__init__()
        self.model, self.arch = model, arch

    def forward(self, x, y):
        return model_lib.lm_loss(self.model, x, y, arch=self.arch)


# -----------------------------------------------------------------------------
# checkpoints

def _unwrap(model):
    """The plain nn.Module under DDP (.module), torch.compile (._orig_mod) and LossOf (.model) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(model, LossOf):
            model = model.model
        else:
            return model


def save_checkpoint(model, optimizer, iteration, out, **extra):
    """torch.save {model, optimizer, iteration, model_config, **extra} to a path (atomically: temp file, fsync,
    rename, so a crash mid-write never leaves a broken ckpt.pt) or to a binary file object."""
    raw = _unwrap(model)
    obj = {"model": model_lib.unwrapped_state_dict(raw.state_dict()), "optimizer": optimizer.state_dict(),
           "iteration": int(iteration)}
    if hasattr(raw, "model_config"):
        obj["model_config"] = raw.model_config()
    obj.update(extra)
    if isinstance(out, (str, os.PathLike)):
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
    else:
        torch.save(obj, out)


def read_checkpoint(src, map_location="cpu"):
    """model.read_checkpoint (one clear line when the file is broken), and it must be one of ours."""
    ckpt = model_lib.read_checkpoint(src, map_location)
    if "model" not in ckpt or "iteration" not in ckpt:
        name = src if isinstance(src, (str, os.PathLike)) else getattr(src, "name", "<file object>")
        raise ValueError(f"{name}: not a train.py checkpoint (expected a dict with 'model' and 'iteration')")
    return ckpt


def load_checkpoint(src, model, optimizer=None, ckpt=None):
    """Restore model (and optimizer) state from a path or file object; returns the iteration it was saved at."""
    ckpt = ckpt if ckpt is not None else read_checkpoint(src)
    _unwrap(model).load_state_dict(model_lib.unwrapped_state_dict(ckpt["model"]))
    if optimizer is not None and ckpt.get("optimizer") is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    return int(ckpt["iteration"])


def rng_state():
    """Every RNG as tensors and plain types (loadable with weights_only=True)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():   # this process's GPU only: a resume may see fewer GPUs (or another rank's)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    v, s, g = state["python"]
    random.setstate((v, tuple(s), g))
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_state = state["cuda"]
        if isinstance(cuda_state, (list, tuple)):   # older checkpoints held every visible GPU's state
            cuda_state = cuda_state[torch.cuda.current_device()] if torch.cuda.current_device() < len(cuda_state) else None
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state)


# -----------------------------------------------------------------------------
# configuration helpers

AUTO_FLAGS = ("compile", "tf32", "fused", "resume", "pad_vocab")  # true/false/auto; every other switch is true/false
PATH_FLAGS = ("out_dir", "data_dir", "plot", "hellaswag_path", "lambada_path", "init_from")   # init_from: or a name


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


def _auto(value, when_auto):
    """Resolve a true/false/auto setting."""
    value = _parse_bool(value)
    return when_auto if value == "auto" else value


def torchrun_rank(device):
    """(rank, local_rank, world_size, device, backend) of a process torchrun started, from its RANK, LOCAL_RANK and
    WORLD_SIZE: on CUDA the process takes the GPU of its LOCAL_RANK (model.rank_gpu: on a second node of 8 GPUs RANK 9
    is LOCAL_RANK 1, cuda:1) and NCCL; elsewhere gloo."""
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(device)
    if device.type == "cuda":
        device = model_lib.rank_gpu(local_rank)
    return rank, local_rank, world, device, "nccl" if device.type == "cuda" else "gloo"


def device_settings(cfg, device):
    """What --tf32, --dtype, --pad_vocab, --fused and --compile come to on `device`: "auto" turns each on for a CUDA
    device and off elsewhere; --dtype=auto is bfloat16 only on a GPU that has it natively (not emulated, as on a V100).
    Returns dict(tf32, dtype (a name), pad_vocab (the multiple), fused, compile)."""
    cuda = torch.device(device).type == "cuda"
    bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    dtype = cfg["dtype"] if cfg["dtype"] != "auto" else ("bfloat16" if bf16 else "float32")
    return dict(tf32=_auto(cfg["tf32"], cuda), dtype=dtype, pad_vocab=64 if _auto(cfg["pad_vocab"], cuda) else 1,
                fused=_auto(cfg["fused"], cuda), compile=_auto(cfg["compile"], cuda))


def parse_duration(s):
    """'45m' -> 2700.0 seconds ('90s', '1.5h', '600' = seconds)."""
    s = str(s).strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(s[-1:], None)
    try:
        return float(s[:-1]) * scale if scale else float(s)
    except ValueError:
        raise ValueError(f"--time_budget: expected a duration like 45m, 90s or 1.5h, got {s!r}") from None


def build_parser():
    p = argparse.ArgumentParser(description="Train a language model (see the module docstring for commands).",
                                allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for name, default, help_text in CONFIG:
        if isinstance(default, bool) or name in AUTO_FLAGS:
            p.add_argument(f"--{name}", type=_parse_bool if name in AUTO_FLAGS else _parse_switch, nargs="?",
                           const=True, default=default, help=help_text)
        else:   # a path's ~ is expanded here: the shell leaves --out_dir=~/runs as it is
            p.add_argument(f"--{name}", type=os.path.expanduser if name in PATH_FLAGS else type(default), default=default,
                           help=help_text)
    p.error = lambda message: p.exit(2, f"{p.prog}: {message} (see --help)\n")   # one line, no usage block
    return p


def get_config(argv=None):
    """defaults <- preset <- flags given on the command line. Returns (config, names given explicitly)."""
    argv = list(argv or [])
    args = build_parser().parse_args(argv)
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    explicit = {k: v for k, v in vars(args).items() if k in given}
    return resolve_config(explicit), explicit


def resolve_config(overrides):
    cfg = dict(DEFAULTS)
    preset = overrides.get("preset", "")
    if preset:
        if preset not in PRESETS:
            raise SystemExit(f"train.py: --preset: unknown {preset!r}; choose from {', '.join(PRESETS)}")
        cfg.update(PRESETS[preset])
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}")
    cfg.update(overrides)
    if "data_dir" in overrides and "prepare_data" not in overrides:
        cfg["prepare_data"] = False   # a folder named on the command line is the user's: never filled with stories
    return cfg


def check_config(cfg):
    """Refuse out-of-range settings before any work is done, naming the flag (train() calls it first)."""
    rules = [   # (flags, test, what is expected)
        (("batch_size", "context_length", "d_model", "num_layers", "num_heads", "eval_interval", "eval_iters",
          "log_interval"), lambda v: v >= 1, ">= 1"),
        (("d_ff", "max_iters", "warmup_iters", "lr_decay_iters", "total_batch_tokens", "eval_tokens", "ckpt_interval",
          "num_samples", "sample_tokens", "num_threads", "learning_rate", "weight_decay", "eps", "grad_clip"),
         lambda v: v >= 0, ">= 0"),
        (("temperature",), lambda v: 0 <= v < math.inf, "finite and >= 0 (0 = greedy)"),
        (("rope_theta",), lambda v: v > 0, "> 0"),
        (("min_lr_ratio",), lambda v: 0 <= v <= 1, "in [0, 1]"),
        (("beta1", "beta2"), lambda v: 0 <= v < 1, "in [0, 1)"),
        (("top_p",), lambda v: 0 < v <= 1, "in (0, 1]"),
        (("learning_rate", "weight_decay", "eps", "rope_theta"), math.isfinite, "finite"),   # inf: NaN loss, or no RoPE
    ]
    for names, ok, what in rules:
        for name in names:
            if not ok(cfg[name]):   # written so that NaN fails too
                raise ValueError(f"--{name} must be {what}, got {cfg[name]}")
    choices = {"model": ("llama", "gpt2"), "ffn_type": ("swiglu", "silu"), "attn_impl": ("sdpa", "scratch"),
               "sampler": ("sequential", "random"), "dtype": ("auto", "float32", "bfloat16")}
    for name, allowed in choices.items():
        if cfg[name] not in allowed:
            raise ValueError(f"--{name}: expected {' or '.join(allowed)}, got {cfg[name]!r}")
    if cfg["model"] == "gpt2":   # the Llama-only flags: GPT-2 has LayerNorm, a 4*d GELU MLP and learned positions
        llama_only = [f"--{k}={cfg[k]}" for k in ("d_ff", "rope_theta", "remove_rmsnorm", "use_post_norm", "remove_rope",
                                                   "ffn_type") if cfg[k] != DEFAULTS[k]]
        if llama_only:
            raise ValueError(f"{', '.join(llama_only)}: only for --model=llama (pass the default with --model=gpt2)")
    elif _parse_bool(cfg["pad_vocab"]) is True:
        raise ValueError("--pad_vocab=true: only for --model=gpt2 (the Llama model's vocabulary is not padded)")
    if cfg["d_model"] % cfg["num_heads"]:
        raise ValueError(f"--d_model={cfg['d_model']} must be a multiple of --num_heads={cfg['num_heads']}")
    if not 0 <= cfg["seed"] < 2 ** 32:
        raise ValueError(f"--seed must be in [0, 2**32), got {cfg['seed']}")
    if cfg["prepare_data"] and cfg["vocab_size"] < 257:
        raise ValueError(f"--vocab_size must be >= 257 (256 bytes + <|endoftext|>) to train the tokenizer, "
                         f"got {cfg['vocab_size']}")
    if cfg["init_from"] != "scratch" and cfg["model"] != "gpt2":
        raise ValueError(f"--init_from={cfg['init_from']} needs --model=gpt2")
    world = int(os.environ.get("WORLD_SIZE", "1"))   # (torchrun's: batch arithmetic is checked before data prep)
    grad_accum_steps(cfg["total_batch_tokens"], cfg["batch_size"], cfg["context_length"], world)
    if cfg["eval_tokens"] % (cfg["batch_size"] * cfg["context_length"] * world):
        raise ValueError(f"--eval_tokens={cfg['eval_tokens']:,} is not a multiple of batch_size*context_length"
                         f"*world_size = {cfg['batch_size'] * cfg['context_length'] * world:,}: pick one, so that "
                         f"every run scores the same tokens")
    if cfg["time_budget"] and not parse_duration(cfg["time_budget"]) > 0:
        raise ValueError(f"--time_budget must be > 0 ('' = none), got {cfg['time_budget']!r}")
    # an unknown backend would be a traceback at step 1; listing them imports torch._dynamo (~1.4 s of start-up on
    # CPU), so the default one, always there, is not looked up
    backend = cfg["compile_backend"]
    if backend != DEFAULTS["compile_backend"] and backend not in torch.compiler.list_backends(exclude_tags=()):
        raise ValueError(f"--compile_backend: expected a torch.compile backend (inductor, aot_eager, ...: see "
                         f"torch.compiler.list_backends()), got {backend!r}")


def model_config_from(cfg, vocab_size):
    """The model.py build_model() dict for this run."""
    if cfg["model"] == "llama":
        d_ff = cfg["d_ff"] or (flops.llama_d_ff(cfg["d_model"]) if cfg["ffn_type"] == "swiglu" else 4 * cfg["d_model"])
        return dict(arch="llama", vocab_size=vocab_size, context_length=cfg["context_length"], d_model=cfg["d_model"],
                    num_layers=cfg["num_layers"], num_heads=cfg["num_heads"], d_ff=d_ff, rope_theta=cfg["rope_theta"],
                    remove_rmsnorm=cfg["remove_rmsnorm"], use_post_norm=cfg["use_post_norm"],
                    remove_rope=cfg["remove_rope"], ffn_type=cfg["ffn_type"], attn_impl=cfg["attn_impl"])
    if cfg["model"] == "gpt2":
        return dict(arch="gpt2", block_size=cfg["context_length"], vocab_size=vocab_size, n_layer=cfg["num_layers"],
                    n_head=cfg["num_heads"], n_embd=cfg["d_model"], attn_impl=cfg["attn_impl"],
                    pad_vocab_to_multiple_of=cfg["_pad_vocab"])
    raise ValueError(f"--model: expected llama or gpt2, got {cfg['model']!r}")


def grad_accum_steps(total_batch_tokens, batch_size, context_length, world_size):
    per_step = batch_size * context_length * world_size
    if total_batch_tokens == 0:
        return 1
    if total_batch_tokens % per_step:
        raise ValueError(f"--total_batch_tokens={total_batch_tokens:,} is not divisible by batch_size*context_length"
                         f"*world_size = {batch_size}*{context_length}*{world_size} = {per_step:,}; pick a multiple")
    return total_batch_tokens // per_step


# -----------------------------------------------------------------------------
# evaluation helpers

def _kept_on_resume(line, step):
    """Whether a log.jsonl line stays when a run resumes at `step`: the records up to it, not a line that a crash
    tore mid-write."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("step", 0) <= step


def bytes_per_token(tokenizer, ids, eot_id):
    """Bytes per token: the tokens' own bytes, so a UTF-8 character cut at either end of the window counts only the
    bytes inside it (eot tokens count as tokens with 0 bytes)."""
    ids = [int(t) for t in ids]
    return len(tokenizer.decode_bytes([t for t in ids if t != eot_id])) / max(1, len(ids))


@torch.no_grad()
def estimate_val_loss(model, shards, cfg, arch, device, autocast, rank, world, eval_iters):
    """Mean next-token loss (nats) over the first eval_iters*B*T*world tokens of the validation data."""
    lm_loss = model_lib.lm_loss
    loader = SequentialSampler(shards, cfg["batch_size"], cfg["context_length"], rank, world, shuffle=False)
    model.eval()
    total = torch.zeros((), device=device)
    for _ in range(eval_iters):
        x, y = loader.next_batch(device)
        with autocast:
            total += lm_loss(model, x, y, arch=arch).float()
    model.train()
    total /= eval_iters
    if world > 1:
        torch.distributed.all_reduce(total)   # SUM then divide: ReduceOp.AVG is NCCL-only on older torch
        total /= world
    return total.item()


def generate_samples(model, tokenizer, cfg, device, autocast, seed):
    """A few samples from the plain (uncompiled) module: generation's changing shapes would recompile."""
    prompt = tokenizer.encode(cfg["sample_prompt"]) if cfg["sample_prompt"] else [tokenizer.eot_id or 0]
    prompt = prompt[-model.context_length:]   # (the run said so once, at its start)
    g = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    with autocast:
        outs = generate(model, [prompt] * cfg["num_samples"], cfg["sample_tokens"], temperature=cfg["temperature"],
                        top_p=cfg["top_p"], stop_token=tokenizer.eot_id, generator=g)
    model.train()
    return [tokenizer.decode(prompt + list(o)) for o in outs]


def _mfu(mcfg, T, tokens_per_sec, device, dtype):
    try:
        return flops.mfu(mcfg, T, tokens_per_sec, device.type if device.type == "cpu" else str(device), dtype)
    except Exception:   # a GPU without a known peak: leave the column out
        return None


def _fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _files_summary(files):
    """[[name, tokens], ...] -> "2 file(s) of 1,005 tokens"."""
    return f"{len(files)} file(s) of {sum(n for _, n in files):,} tokens"


# -----------------------------------------------------------------------------
# the training run

class _Stop:
    """A stop request, Ctrl-C (SIGINT) or SIGTERM (a scheduler's preemption notice; torchrun passes either on to its
    workers): finish the step, write a checkpoint, stop. In one process a second request aborts at once. Under
    torchrun a worker gets a terminal's Ctrl-C twice (from the terminal and again from torchrun), so repeats are
    ignored there, even after the loop (the repeat can arrive late, during the teardown): torchrun kills its
    workers itself --shutdown_timeout seconds (30) after the first signal."""
    requested = None      # None, or what asked: "ctrl-c" / "SIGTERM"
    repeat_aborts = True
    quiet = False

    @classmethod
    def handler(cls, signum, frame):
        if cls.requested:
            if cls.repeat_aborts:
                raise KeyboardInterrupt
            return
        cls.requested = "SIGTERM" if signum == getattr(signal, "SIGTERM", None) else "ctrl-c"
        if not cls.quiet:
            print(f"\ntrain.py: {cls.requested}: stopping after this step" +
                  (" (Ctrl-C again to abort without a checkpoint)" if cls.repeat_aborts else ""), flush=True)


def _print(*args, **kw):
    try:
        print(*args, **kw, flush=True)   # progress shows up at once even through a pipe or a log file
    except BrokenPipeError:   # the reader went away (`| head`): train on quietly, log.jsonl keeps every line
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _lock(folder, what):
    """Hold folder/.lock exclusively until the returned file is closed, so that two runs cannot write one folder at
    once (their logs and checkpoints would interleave); None where fcntl does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    f = open(Path(folder) / ".lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(f"{folder}: in use by another {what} (it holds {Path(folder) / '.lock'}): wait for it to "
                         f"finish, or use another folder") from None
    return f


def train(cfg, clock=time.perf_counter, on_step=None, log=_print):
    """Run one training job described by cfg (a full config dict, see CONFIG). Returns a summary dict.
    clock: the time source for --time_budget (tests inject a fake one). on_step(step): called after each
    optimizer step (tests use it to simulate a crash)."""
    cfg = dict(cfg)
    check_config(cfg)
    # ---- processes, device, precision -------------------------------------------------------------------------
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = model_lib.resolve_device(cfg["device"])
    if cfg["num_threads"]:
        torch.set_num_threads(cfg["num_threads"])
    rank, local_rank, world, backend = 0, 0, 1, None
    if ddp:
        rank, local_rank, world, device, backend = torchrun_rank(device)
    if device.type == "cuda" and device.index is not None:   # a rank's GPU or --device=cuda:N: synchronize(),
        torch.cuda.set_device(device)                          # pin_memory(), bf16 support and NCCL use this one
    if ddp and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend)
    master = rank == 0
    say = log if master else (lambda *a, **k: None)
    cuda = device.type == "cuda"
    settings = device_settings(cfg, device)
    if settings["tf32"]:
        torch.set_float32_matmul_precision("high")
    dtype_name = settings["dtype"]
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if dtype_name == "bfloat16" else contextlib.nullcontext())
    cfg["_pad_vocab"] = settings["pad_vocab"]
    random.seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])   # same on every rank: identical init (DDP also broadcasts rank 0's weights)

    # ---- data ---------------------------------------------------------------------------------------------------
    out_dir = Path(cfg["out_dir"])
    data_dir = Path(cfg["data_dir"])
    # prepare only a folder that prepare_tinystories made (or an empty one): never overwrite someone's own data
    if cfg["prepare_data"] and ((data_dir / "prepared.json").exists() or not any(data_dir.glob("train*.bin"))):
        # the other ranks wait for rank 0 on a gloo group of their own: preparing all of TinyStories takes longer
        # than the 10 minutes NCCL allows one collective (if rank 0 fails, torchrun stops them all)
        wait = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(hours=3)) if ddp else None
        if master:
            with _lock(data_dir, "train.py preparing its data") or contextlib.nullcontext():
                fineweb.prepare_tinystories(
                    data_dir=cfg["data_dir"], vocab_size=cfg["vocab_size"], allow_download=cfg["download"],
                    fresh=cfg["fresh"], log=say, corpus_bytes=cfg["corpus_bytes"])
        if ddp:
            torch.distributed.barrier(group=wait)
            torch.distributed.destroy_process_group(wait)
    train_shards, val_shards = find_shards(cfg["data_dir"], "train"), find_shards(cfg["data_dir"], "val")
    if not train_shards:
        cmd = PREPARE_COMMANDS.get(cfg["preset"])
        own = PRESETS.get(cfg["preset"], {}).get("data_dir")
        if cmd and cfg["data_dir"] != own:   # the preset's data asked for in another folder: prepare that one
            cmd = cmd.replace(f"--out_dir={own}", f"--out_dir={shlex.quote(cfg['data_dir'])}")
        raise ValueError(f"{cfg['data_dir']}: no train*.bin token files" +
                         (f"; prepare them with:\n  {cmd}" if cmd else " (make them with bpe.py --encode or fineweb.py, or "
                                                                   "pass --prepare_data=true for the main job's stories)"))
    if not val_shards:   # no separate validation split: hold out the last shard (or say so for a single file)
        if len(train_shards) < 2:
            raise ValueError(f"{cfg['data_dir']}: no val*.bin token file next to the train data")
        val_shards = train_shards[-1:]
        train_shards = train_shards[:-1]
    metas = [m for _, _, m in train_shards + val_shards]
    tok_ref = metas[0].get("tokenizer")
    fingerprints = {m.get("tokenizer_fingerprint") for m in metas}   # the tokenizer's content (older files: none)
    if None in fingerprints or len(fingerprints) > 1:   # else one tokenizer, though named by several paths
        if any(m.get("tokenizer") != tok_ref for m in metas):
            raise ValueError(f"{cfg['data_dir']}: token files were written by different tokenizers "
                             f"{sorted({str(m.get('tokenizer')) for m in metas})}")
        if len(fingerprints - {None}) > 1:
            raise ValueError(f"{cfg['data_dir']}: token files were written by different versions of tokenizer "
                             f"{tok_ref!r} (fingerprints {', '.join(sorted(fingerprints - {None}))}): re-encode "
                             f"them all with one")
    fingerprints.discard(None)
    first = None   # (sidecar, vocab_size) of the first token file: every other one must agree
    for path, _, m in train_shards + val_shards:
        if "vocab_size" not in m:
            raise ValueError(f'{path}.json: missing "vocab_size"')
        if type(m["vocab_size"]) is not int or m["vocab_size"] < 1:
            raise ValueError(f'{path}.json: "vocab_size" must be a positive integer, got {m["vocab_size"]!r}')
        if first is None:
            first = (f"{path}.json", m["vocab_size"])
        elif m["vocab_size"] != first[1]:
            raise ValueError(f"{cfg['data_dir']}: token files disagree on vocab_size ({first[0]}: {first[1]}, "
                             f"{path}.json: {m['vocab_size']})")
    data_vocab = first[1]
    eot_id = metas[0].get("eot_id")
    if eot_id is not None and (type(eot_id) is not int or not 0 <= eot_id < data_vocab):
        raise ValueError(f'{train_shards[0][0]}.json: "eot_id" must be a token id in [0, {data_vocab}) or null, '
                         f"got {eot_id!r}")
    if (cfg["prepare_data"] or cfg["preset"]) and cfg["vocab_size"] < data_vocab:
        say(f"train.py: the data's vocabulary is {data_vocab} (--vocab_size={cfg['vocab_size']}): using {data_vocab}")
    tokenizer = None
    if tok_ref:
        # the tokenizer named, or the one beside the data when the data folder was moved or copied with it: the
        # one named is gone, or was retrained since while the copy beside the data still matches. The checkpoint
        # names the one used.
        beside = Path(cfg["data_dir"]) / Path(tok_ref).name
        if tok_ref != "gpt2" and beside.exists() and (not Path(tok_ref).exists() or (
                fingerprints and bpe.tokenizer_fingerprint(tok_ref) not in fingerprints
                and bpe.tokenizer_fingerprint(beside) in fingerprints)):
            tok_ref = str(beside)
        try:
            tokenizer = bpe.load_tokenizer(tok_ref)
        except Exception as e:
            say(f"train.py: tokenizer {tok_ref!r} could not be loaded ({e}): no bits/byte or samples")
        if tokenizer is not None and tokenizer.vocab_size != data_vocab:   # bits/byte, samples, HellaSwag: all wrong
            raise ValueError(f"{first[0]}: vocab_size {data_vocab}, but its tokenizer {tok_ref!r} has "
                             f"{tokenizer.vocab_size} tokens: the token files and the tokenizer do not belong together")
        now = bpe.tokenizer_fingerprint(tok_ref) if tokenizer is not None else None
        if now and fingerprints and now not in fingerprints:   # a tokenizer retrained into the same folder
            raise ValueError(f"{first[0]}: encoded with tokenizer {tok_ref!r} as it was then (fingerprint "
                             f"{next(iter(fingerprints))}); it has changed since ({now}), so the ids no longer "
                             f"mean its tokens: re-encode the data with it")
        fingerprints = fingerprints or {now}

    # ---- batch arithmetic ------------------------------------------------------------------------------------------
    B, T = cfg["batch_size"], cfg["context_length"]
    accum = grad_accum_steps(cfg["total_batch_tokens"], B, T, world)
    tokens_per_step = B * T * accum * world
    max_iters = cfg["max_iters"]
    decay_iters = cfg["lr_decay_iters"] or max_iters
    budget = parse_duration(cfg["time_budget"]) if cfg["time_budget"] else None

    # ---- model and optimizer -------------------------------------------------------------------------------------------
    # the model's vocabulary is the data's (the tokenizer's): a larger one would let samples pick undecodable ids
    ckpt_path = out_dir / "ckpt.pt"
    resume_ckpt = cfg.pop("_resume_ckpt", None)
    if resume_ckpt is None and _parse_bool(cfg["resume"]) is True and not cfg["fresh"]:
        resume_ckpt = read_checkpoint(ckpt_path)   # on the CPU: the RNG states must stay there
    if resume_ckpt is not None:
        try:   # one clear line when the weights do not fit the model_config (another architecture or shape)
            raw = model_lib.model_from_checkpoint(resume_ckpt)
        except ValueError as e:
            raise ValueError(f"{ckpt_path}: {e}") from None
    elif cfg["init_from"] != "scratch":
        raw = model_lib.GPT.from_pretrained(cfg["init_from"], pad_vocab_to_multiple_of=cfg["_pad_vocab"],
                                            attn_impl=cfg["attn_impl"])
    else:
        raw = model_lib.build_model(model_config_from(cfg, data_vocab))
    vocab_size = raw.vocab_size
    if vocab_size != data_vocab:   # --init_from or a checkpoint: its ids must mean the data's tokens
        source = f"--init_from={cfg['init_from']}" if resume_ckpt is None else str(ckpt_path)
        raise ValueError(f"{source}: the model has a vocabulary of {vocab_size:,} ids, the data in {cfg['data_dir']} "
                         f"{data_vocab:,} (tokenizer {tok_ref!r}): tokenize the data with the model's tokenizer")
    trained_with = resume_ckpt.get("tokenizer_fingerprint") if resume_ckpt is not None else None   # older: none
    if trained_with and next(iter(fingerprints), None) not in (None, trained_with):   # same size, other tokens
        raise ValueError(f"{ckpt_path}: trained on ids of tokenizer fingerprint {trained_with}, but the data in "
                         f"{cfg['data_dir']} was encoded with {next(iter(fingerprints))} (tokenizer {tok_ref!r}): "
                         f"resume on the data it was trained on, or start a new run with --fresh")
    for path, arr, _ in train_shards + val_shards:   # an id >= vocab_size is refused before training starts
        check_token_range(arr, vocab_size, path)
    raw.to(device)
    arch = raw.model_config()["arch"] if hasattr(raw, "model_config") else cfg["model"]
    if T > raw.context_length:
        raise ValueError(f"--context_length={T} is longer than the model's {raw.context_length}")
    mcfg = raw.model_config()
    groups = model_lib.param_groups(raw, cfg["weight_decay"])
    fused = settings["fused"]
    betas = (cfg["beta1"], cfg["beta2"])
    if fused:
        optimizer = torch.optim.AdamW(groups, lr=cfg["learning_rate"], betas=betas, eps=cfg["eps"], fused=True)
    else:
        optimizer = AdamW(groups, lr=cfg["learning_rate"], betas=betas, eps=cfg["eps"])

    if cfg["warmup_iters"] >= decay_iters:   # e.g. the defaults' 50 warmup steps in a run shortened to 20
        say(f"train.py: --warmup_iters={cfg['warmup_iters']} is not below the schedule's length of {decay_iters} steps "
            f"(--lr_decay_iters, else --max_iters): the learning rate never reaches --learning_rate")
    # what a checkpoint records of its training data (a resume checks it, from a moved copy too): file names and
    # sizes, in the order the sampler's position counts them
    train_files = [[Path(p).name, len(a)] for p, a, _ in train_shards]
    if cfg["sampler"] == "sequential":
        loader = SequentialSampler(train_shards, B, T, rank, world, seed=cfg["seed"], eot_id=eot_id)
        short = [str(p) for p, a, _ in train_shards if len(a) < B * T * world + 1]
        if short:   # the reader skips them: say so rather than train on less data in silence
            say(f"train.py: {len(short)} training file(s) shorter than one batch ({B * T * world + 1:,} tokens) "
                f"will never be read: {', '.join(short[:3])}{' ...' if len(short) > 3 else ''}")
    else:
        loader = RandomSampler(train_shards, B, T, seed=cfg["seed"], rank=rank)

    # ---- resume ----------------------------------------------------------------------------------------------------------
    step, elapsed, best_val, val_step = 0, 0.0, None, None   # val_step: the step val_loss was measured at
    if resume_ckpt is not None:
        ckpt = resume_ckpt
        for group in ckpt["optimizer"]["param_groups"]:   # torch places each state's "step" by the loaded groups'
            group["fused"] = fused   # flags: on the device for fused AdamW, on the CPU (no sync per .item()) for ours
        saved_files, saved_dir = ckpt.get("train_files"), ckpt.get("config", {}).get("data_dir")
        if saved_files is None and saved_dir is not None and saved_dir != cfg["data_dir"]:
            raise ValueError(f"{ckpt_path} was trained on {saved_dir} and predates the record that lets a resume "
                             f"check moved data: resume with --data_dir={saved_dir}, or start over with --fresh")
        if saved_files is not None and saved_files != train_files:   # names and sizes, in the sampler's order
            raise ValueError(f"{ckpt_path}: its run trained on other token files than {cfg['data_dir']} holds "
                             f"now ({_files_summary(saved_files)} then, {_files_summary(train_files)} now): resume "
                             f"with the same data, or start over with --fresh")
        step = load_checkpoint(None, raw, optimizer, ckpt=ckpt)
        saved_world = len(ckpt["loader"]) if isinstance(ckpt["loader"], list) else 1
        if saved_world != world:
            raise ValueError(f"{ckpt_path} was written by {saved_world} process(es): resume it with the same number "
                             f"(this run has {world}) so every rank continues its own data stream")
        try:
            loader.load_state_dict(ckpt["loader"][rank] if isinstance(ckpt["loader"], list) else ckpt["loader"])
        except (IndexError, KeyError, TypeError, ValueError):   # e.g. a shard that is no longer there
            raise ValueError(f"{ckpt_path}: its data position does not exist in {cfg['data_dir']} ("
                             f"{len(train_shards)} training file(s)): the data changed since the checkpoint; resume "
                             f"with the same data, or start over with --fresh") from None
        set_rng_state(ckpt["rng"])
        # (val_step: checkpoints written before it was saved were evaluated at their step, unless ckpt_interval)
        elapsed, best_val, val_step = ckpt.get("elapsed", 0.0), ckpt.get("val_loss"), ckpt.get("val_step", step)
        say(f"resumed {ckpt_path} at step {step}")
        old = ckpt.get("config", {})
        old_decay = old.get("lr_decay_iters") or old.get("max_iters")
        clocked = budget is not None or bool(old.get("time_budget"))
        if step > 0 and old_decay and old_decay != decay_iters and not clocked:   # e.g. a larger --max_iters
            say(f"train.py: the cosine now ends at step {decay_iters:,}, not {old_decay:,} as in the checkpoint's "
                f"run, so the learning rate jumps at step {step:,} (pass --lr_decay_iters={old_decay} to keep its "
                "schedule)")
        # under a budget the clock is mapped onto max_iters as well: no flag keeps the schedule while extending
        # the run, so say what the change does to the learning rate
        keys = ("time_budget", "max_iters", "lr_decay_iters")
        changed = [f"--{k} {old[k] if old[k] != '' else 'none'} -> {cfg[k] if cfg[k] != '' else 'none'}"
                   for k in keys if k in old and old[k] != cfg[k]]
        if step > 0 and changed and clocked:
            was = scheduled_lr({**cfg, **{k: old[k] for k in keys if k in old}}, step, elapsed)
            now = scheduled_lr(cfg, step, elapsed)
            if f"{now:.3g}" != f"{was:.3g}":
                say(f"train.py: under --time_budget the schedule maps the clock onto --max_iters; with "
                    f"{', '.join(changed)} the learning rate at step {step:,} is {now:.3g}, not {was:.3g} as in the "
                    f"checkpoint's run")
    cfg.pop("_resume_ckpt", None)

    model = LossOf(raw, arch)   # (x, y) -> loss: compiled, the loss is in the graph with the model
    compiled = settings["compile"]
    if compiled:
        model = torch.compile(model, backend=cfg["compile_backend"])
    if ddp:   # (it broadcasts Llama's constant RoPE buffers every forward: small. The switch against that,
        # broadcast_buffers, warns on every rank in torch 2.13, and its successor fails on older versions)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)

    # ---- bits per byte: UTF-8 bytes of exactly the validation tokens that are scored ---------------------------------
    val_len = sum(len(a) for _, a, _ in val_shards)
    check_batch_fits(val_shards, B * T * world + 1, "validation data")
    # the evaluator skips files shorter than one batch and reads only the first one that holds a batch
    scored_path, scored = next((p, a) for p, a, _ in val_shards if len(a) >= B * T * world + 1)
    if cfg["eval_tokens"]:   # exactly these tokens at any batch size or world size (a multiple: check_config)
        if cfg["eval_tokens"] + 1 > len(scored):
            raise ValueError(f"--eval_tokens={cfg['eval_tokens']:,}: the validation file scored, {scored_path}, "
                             f"holds only {len(scored) - 1:,} targets")
        eval_iters = cfg["eval_tokens"] // (B * T * world)
    else:
        eval_iters = max(1, min(cfg["eval_iters"], (len(scored) - 1) // (B * T * world)))
    bpt = None if tokenizer is None else bytes_per_token(tokenizer, scored[1:eval_iters * B * T * world + 1], eot_id)

    # ---- downstream tasks and samples: checked before the log or a checkpoint is touched ----------------------
    def task_examples(name, lib):
        """The examples of a downstream task asked for with --NAME (scored with the data's tokenizer), or None."""
        if not cfg[name] or tokenizer is None:
            return None
        try:
            return lib.load_examples(cfg[f"{name}_path"] or None)
        except (ValueError, RuntimeError) as e:  # a missing or malformed file, or offline without a local copy
            raise ValueError(f"--{name}_path: {e}" if cfg[f"{name}_path"] else f"--{name}: {e}") from None

    def task_figures(task, res, figures):
        """The figures of a downstream task's result to log, or none when no example fit the model's context. The
        examples it cannot score (an ending or target longer than the context) are said once: the context never
        changes, so neither does their number, and the figures are over the others only."""
        if res["num_skipped"] and task not in said_skipped:
            said_skipped.add(task)
            scored = (f"its figures are over the other {res['num_total']}" if res["num_total"] else
                      "it is not scored")
            say(f"train.py: {task}: {res['num_skipped']} of {res['num_skipped'] + res['num_total']} examples do not "
                f"fit the model's context ({raw.context_length} tokens): {scored}")
        return figures if res["num_total"] else {}

    said_skipped = set()
    if tokenizer is None and (cfg["hellaswag"] or cfg["lambada"]):
        say("train.py: the data names no tokenizer that loads: no HellaSwag or LAMBADA evaluation")
    hellaswag_examples, lambada_examples = task_examples("hellaswag", hellaswag), task_examples("lambada", lambada)
    if tokenizer is not None and cfg["num_samples"] > 0 and cfg["sample_prompt"]:
        n = len(tokenizer.encode(cfg["sample_prompt"]))
        if n > raw.context_length:
            say(f"train.py: --sample_prompt is {n} tokens, the context is {raw.context_length}: the samples keep "
                f"its last {raw.context_length}")

    # ---- logging ---------------------------------------------------------------------------------------------------------
    log_path = out_dir / "log.jsonl"
    logf, run, lock = None, None, None
    if master:
        lock = _lock(out_dir, "training run")
        for stale in out_dir.glob(f"{ckpt_path.name}.tmp*"):   # a save cut short by a hard kill (SIGKILL skips the
            stale.unlink(missing_ok=True)                        # cleanup): gigabytes at GPT-2 scale
        if resume_ckpt is not None and log_path.exists():   # drop what a crashed run logged after its checkpoint
            kept = [line for line in log_path.read_text().splitlines() if _kept_on_resume(line, step)]
            tmp = log_path.with_name(log_path.name + ".tmp")   # renamed over the log: a crash now leaves the old
            with open(tmp, "w") as f:                           # log or the new one, never an empty file
                f.writelines(line + "\n" for line in kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, log_path)
            logf = open(log_path, "a")
        else:
            if resume_ckpt is None and ckpt_path.exists():   # a new run here (--fresh, --resume=false): the old run's
                ckpt_path.unlink()   # checkpoint goes with its log, so a crash before this run's first checkpoint
                say(f"train.py: starting over in {out_dir}: removed the previous run's checkpoint")   # cannot mix them
            logf = open(log_path, "w")
        if cfg["wandb"]:
            try:
                import wandb
                run = wandb.init(project=cfg["wandb_project"], config=cfg, resume="allow")
            except ImportError:
                say("train.py: --wandb given but wandb is not installed (pip install wandb): logging locally only")

    def record(kind, **fields):
        if logf is not None:
            logf.write(json.dumps({"type": kind, **fields}) + "\n")
            logf.flush()
        if run is not None:
            run.log({f"{kind}/{k}": v for k, v in fields.items() if isinstance(v, (int, float))}, step=fields.get("step"))

    n_params = sum(p.numel() for p in raw.parameters())
    say(f"model {arch}: {n_params / 1e6:.2f}M parameters | data {cfg['data_dir']}: "
        f"{sum(len(a) for _, a, _ in train_shards):,} train / {val_len:,} val tokens | {tokens_per_step:,} tokens/step "
        f"= {B} x {T} x {accum} accum x {world} procs | {device} {dtype_name}"
        f"{' | compiled' if compiled else ''}")
    if master:
        record("config", **{k: v for k, v in cfg.items() if not k.startswith("_")}, model_config=mcfg,
               tokenizer=tok_ref, world_size=world, params=n_params, resumed_at_step=step if resume_ckpt is not None else None)

    def save(step, val_loss):
        loader_states = [loader.state_dict()]
        if ddp:   # every rank's loader position goes into the one file rank 0 writes
            loader_states = [None] * world
            torch.distributed.all_gather_object(loader_states, loader.state_dict())
        if master:
            save_checkpoint(raw, optimizer, step, ckpt_path, config={k: v for k, v in cfg.items() if not k.startswith("_")},
                            tokenizer=tok_ref or "", tokenizer_fingerprint=next(iter(fingerprints), None),
                            rng=rng_state(), loader=loader_states if ddp else loader_states[0], train_files=train_files,
                            val_loss=val_loss, val_step=val_step, elapsed=elapsed)

    def lr_at(step):
        return scheduled_lr(cfg, step, elapsed)

    def finished():   # the run's end: max_iters, or the time budget spent
        return step >= max_iters or (budget is not None and elapsed >= budget)

    # ---- the loop ----------------------------------------------------------------------------------------------------------
    ckpt_every = cfg["ckpt_interval"] or cfg["eval_interval"]
    stop_signals = [getattr(signal, n) for n in ("SIGINT", "SIGTERM") if hasattr(signal, n)] if _is_main_thread() else []
    old_handlers = {sig: signal.signal(sig, _Stop.handler) for sig in stop_signals}
    _Stop.requested, _Stop.repeat_aborts, _Stop.quiet = None, not ddp, not master
    stop = None   # a stop request this loop acts on (under DDP: once every rank knows of it, see the end of a step)
    start_step, val_loss, samples, last_lr, loss_acc = step, best_val, [], lr_at(step), None
    resumed = resume_ckpt is not None
    t_run = clock()
    try:
        while True:
            done = finished()
            if not ddp:   # (under DDP `stop` is set at the end of each step, once every rank knows of the request)
                stop = _Stop.requested
            stop = None if done else stop   # a request at the last step changes nothing: the run is finished
            last = done or stop is not None
            # periodic duties (not counted in the time budget): eval, HellaSwag, LAMBADA, samples, checkpoint
            # (not again at the step a run resumes from when the checkpoint was evaluated there: the log has it;
            # not at a stop request's step unless one is due there: stopping must fit a scheduler's grace period)
            if (step % cfg["eval_interval"] == 0 or done) and not (resumed and step == start_step == val_step):
                val_loss, val_step = estimate_val_loss(raw, val_shards, cfg, arch, device, autocast, rank, world,
                                                       eval_iters), step
                bpb = val_loss / math.log(2) / bpt if bpt else None
                fields = dict(step=step, val_loss=val_loss, val_bpb=bpb, elapsed=elapsed)
                if hellaswag_examples is not None:
                    with autocast:
                        res = hellaswag.evaluate(raw, tokenizer, hellaswag_examples, device, rank, world)
                    fields.update(task_figures("HellaSwag", res, dict(hellaswag_acc_norm=res["acc_norm"])))
                if lambada_examples is not None:
                    with autocast:
                        res = lambada.evaluate(raw, tokenizer, lambada_examples, device, rank, world)
                    fields.update(task_figures("LAMBADA", res, dict(lambada_acc=res["acc"], lambada_ppl=res["ppl"])))
                say(f"step {step:>6} | val loss {val_loss:.4f}" + (f" | val bpb {bpb:.4f}" if bpb else "") +
                    (f" | hellaswag {fields['hellaswag_acc_norm']:.4f}" if "hellaswag_acc_norm" in fields else "") +
                    (f" | lambada {fields['lambada_acc']:.4f} ppl {fields['lambada_ppl']:.1f}"
                     if "lambada_acc" in fields else ""))
                if master and tokenizer is not None and cfg["num_samples"] > 0:
                    samples = generate_samples(raw, tokenizer, cfg, device, autocast, cfg["seed"] + step)
                    for s in samples:
                        say(f"  sample: {s!r}")
                    fields["samples"] = samples
                record("eval", **fields)
            if (step > start_step and step % ckpt_every == 0) or (last and (step > start_step or step == 0)):
                save(step, val_loss)
            if last:
                break

            # one optimizer step: accum micro-steps, gradient sync only on the last one
            t0 = clock()
            lr = last_lr = lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_acc = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = loader.next_batch(device)
                sync = contextlib.nullcontext() if not ddp or micro == accum - 1 else model.no_sync()
                with sync:
                    with autocast:
                        loss = model(x, y) / accum
                    loss.backward()
                loss_acc += loss.detach()
            norm = gradient_clipping(raw.parameters(), cfg["grad_clip"]) if cfg["grad_clip"] > 0 else None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if cuda:
                torch.cuda.synchronize()
            dt = clock() - t0
            if not (compiled and step == start_step + 1):   # a compiled run's first step is mostly compilation: it
                elapsed += dt                                  # neither spends the budget nor skips the warmup
            if ddp:   # every rank must agree on when to stop: rank 0's clock (for the budget), and whether any rank
                t = torch.tensor([elapsed if master else 0.0, _Stop.requested is not None],   # was asked to stop
                                 dtype=torch.float64, device=device)
                torch.distributed.all_reduce(t)
                elapsed, asked = t.tolist()
                stop = (_Stop.requested or "a stop request on another rank") if asked else None
            # a line every log_interval steps, and at the step the run ends (max_iters, the budget or a stop request)
            if step % cfg["log_interval"] == 0 or finished() or (stop if ddp else _Stop.requested) is not None:
                if ddp:
                    torch.distributed.all_reduce(loss_acc)
                    loss_acc /= world
                train_loss = loss_acc.item()   # the one sync per logged step
                tps = tokens_per_step / dt
                mfu = _mfu(mcfg, T, tps / world, device, dtype_name)
                gn = float(norm) if norm is not None else None
                say(f"step {step:>6}/{max_iters} | loss {train_loss:.4f} | lr {lr:.2e} | " +
                    (f"norm {gn:.3f} | " if gn is not None else "") +   # (not computed with --grad_clip=0)
                    f"{tps:,.0f} tok/s" + (f" | mfu {100 * mfu:.1f}%" if mfu is not None else "") +
                    f" | {_fmt_time(elapsed)}")
                record("train", step=step, loss=train_loss, lr=lr, grad_norm=gn, tokens_per_sec=tps, mfu=mfu,
                       dt=dt, elapsed=elapsed, tokens=step * tokens_per_step)
            if on_step is not None:
                on_step(step)
    finally:
        for sig, old in old_handlers.items():   # the caller's handlers are back; but a torchrun worker that got a
            signal.signal(sig, signal.SIG_IGN if ddp and _Stop.requested else old)   # signal may still get its repeat
        if logf is not None:
            logf.close()
        if lock is not None:
            lock.close()
        if run is not None:
            run.finish()
    bpb = val_loss / math.log(2) / bpt if (bpt and val_loss is not None) else None
    final_lr = lr_at(step)
    if ddp and cfg.get("_destroy_pg", True):
        del model   # DDP and its reducer go before their process group: freed after it (on return), a compiled
        # run's rank 1 hung in the teardown ~1 run in 10 (gloo)
        torch.distributed.barrier()   # ranks tear gloo down together: one leaving early aborted its peer ~1 run in 20
        torch.distributed.destroy_process_group()
    stopped_by = stop or ("max_iters" if step >= max_iters else
                          f"time_budget={cfg['time_budget']} (pass --time_budget= to train by steps only)")
    return dict(stopped_by=stopped_by, step=step, val_loss=val_loss, val_step=val_step, val_bpb=bpb, samples=samples, elapsed=elapsed, lr=final_lr,
                last_lr=last_lr, ckpt=str(ckpt_path), log=str(log_path), params=n_params, wall=clock() - t_run,
                interrupted=stop is not None)


def _is_main_thread():
    import threading
    return threading.current_thread() is threading.main_thread()


# -----------------------------------------------------------------------------
# plots

def plot_log(log_path):
    """loss vs steps and loss vs wall clock PNGs beside log_path; returns their paths."""
    try:
        lines = Path(log_path).read_text().splitlines()
    except FileNotFoundError:
        raise SystemExit(f"train.py: --plot {log_path}: no such file") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise SystemExit(f"train.py: --plot {log_path}: not a text file (expected a log.jsonl)") from None
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line) if line.strip() else {})
        except json.JSONDecodeError:
            raise SystemExit(f"train.py: --plot {log_path} line {n}: not JSON") from None
        if not isinstance(rows[-1], dict):
            raise SystemExit(f"train.py: --plot {log_path} line {n}: not a JSON object")
    # (records missing a figure, as hand-edited logs may, are left out rather than failing the plot)
    tr = [r for r in rows if r.get("type") == "train" and all(k in r for k in ("step", "elapsed", "loss"))]
    ev = [r for r in rows if r.get("type") == "eval" and all(k in r for k in ("step", "elapsed", "val_loss"))]
    if not tr:
        raise SystemExit(f"train.py: {log_path}: no training records to plot")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("train.py: --plot needs matplotlib (pip install matplotlib)") from None
    out = []
    for xkey, xlabel, name in (("step", "step", "loss_vs_steps.png"), ("elapsed", "training time (s)", "loss_vs_time.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([r[xkey] for r in tr], [r["loss"] for r in tr], label="train", lw=1)
        if ev:
            ax.plot([r[xkey] for r in ev], [r["val_loss"] for r in ev], "o-", label="validation")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
        path = Path(log_path).with_name(name)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        out.append(str(path))
    return out


# -----------------------------------------------------------------------------
# the command line

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg, explicit = get_config(argv)
    if cfg["plot"]:
        for p in plot_log(cfg["plot"]):
            print(f"wrote {p}")
        return
    t0 = time.time()
    # resume: the checkpoint's settings, with whatever was given explicitly on top
    ckpt_path = Path(cfg["out_dir"]) / "ckpt.pt"
    resume = _parse_bool(cfg["resume"])
    if resume is True and not ckpt_path.exists():
        raise SystemExit(f"train.py: --resume: no checkpoint at {ckpt_path}")
    if resume is not False and not cfg["fresh"] and ckpt_path.exists():
        try:
            ckpt = read_checkpoint(ckpt_path)
        except ValueError as e:
            raise SystemExit(f"train.py: {e} (use --fresh to start over)")
        old = ckpt.get("config", {})
        asked = set(explicit)   # what this command line sets; a preset's settings only when it names another one
        if cfg["preset"] != old.get("preset", ""):
            asked |= set(PRESETS.get(cfg["preset"], {}))
        changed = {k: (old.get(k), cfg[k]) for k in asked if k not in RESUMABLE_CHANGES and old.get(k) != cfg[k]}
        if changed:
            what = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
            raise SystemExit(f"train.py: {ckpt_path} holds a run with other settings ({what}): "
                             f"use --fresh to start over or another --out_dir")
        cfg = {**DEFAULTS, **old, **{k: cfg[k] for k in asked}, "fresh": False}  # a --fresh first run: not again
        cfg["_resume_ckpt"] = ckpt
    try:
        summary = train(cfg)
    except (ValueError, OSError) as e:   # OSError: an --out_dir that is a file, a full disk, ...
        raise SystemExit(f"train.py: {e}") from None
    except KeyboardInterrupt:   # before the loop's own Ctrl-C handling starts, or a second Ctrl-C inside it
        print("\ntrain.py: interrupted; nothing written since the last checkpoint", file=sys.stderr)
        raise SystemExit(130) from None
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print()
    print(f"done in {_fmt_time(time.time() - t0)} (training {_fmt_time(summary['elapsed'])}), step {summary['step']}"
          f" (stopped by {summary['stopped_by']})"
          + (f" | val loss {summary['val_loss']:.4f} nats/token" if summary["val_loss"] is not None else "")
          + (f" | {summary['val_bpb']:.4f} bits/byte" if summary["val_bpb"] else "")
          + (f" (at step {summary['val_step']})" if summary["val_loss"] is not None and
             summary["val_step"] != summary["step"] else ""))
    if summary["samples"]:
        print(f"sample: {summary['samples'][0]}")
    print(f"checkpoint: {summary['ckpt']}   log: {summary['log']}")
    out_dir, q = Path(summary["ckpt"]).parent, shlex.quote   # (quoted: a path with a space pastes as one argument)
    steps = [(f"python sample.py{'' if out_dir == Path('out') else ' ' + q('--ckpt=' + summary['ckpt'])} --top_p 0.9",
              "more samples from this model"),
             (f"python train.py {q('--plot=' + summary['log'])}", "loss curves as PNG")]
    if summary["interrupted"]:
        steps.insert(0, (f"python train.py --resume{'' if out_dir == Path('out') else ' ' + q(f'--out_dir={out_dir}')}",
                         "continue from the checkpoint"))
    main_job = not cfg["preset"] and cfg["data_dir"] == DEFAULTS["data_dir"]
    if main_job:
        steps.append(("python train.py --preset=tinystories-cpu", "the CS336 baseline shape, once its data exists:"))
    width = max(len(cmd) for cmd, _ in steps)
    print("next:")
    for cmd, why in steps:
        print(f"  {cmd:<{width}}  # {why}")
    if main_job:
        print(f"      {PREPARE_COMMANDS['tinystories-cpu']}")
    if summary["interrupted"]:
        raise SystemExit(130)  # checkpointed, but cut short: scripts that run train.py must not take it as finished


if __name__ == "__main__":
    main()
