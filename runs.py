"""
Run management for train.py: what a training run must also do that is not the ML. train.py's train() calls
each by name, so that it reads as set-up, then the loop; a student reading the loop can skip this file.

* token files: load_tokens / find_shards / open_data check every file against its sidecar and its tokenizer,
  and prepare the main job's data first (fineweb.prepare_tinystories);
* samplers: RandomSampler and SequentialSampler read them as batches, in an order a checkpoint resumes exactly
  (train.make_loader picks one; train.get_batch is the plain random windows they start from); ReadAhead
  fetches each batch one micro-step early;
* resume: resume_settings (main: the checkpoint's settings, refusing a change that would not continue the same
  run), check_model_fits (a checkpoint or released weights against this data) and restore (optimizer, loader
  position, RNGs, clock, with the schedule changes a resume makes said; an FSDP run's shards: restore_shards);
* RunState: what the loop carries from step to step, and when it evaluates and checkpoints (never twice at the
  step a run resumed at);
* RunDir: the out_dir lock, log.jsonl (a resumed run keeps the records up to its step), wandb, and what a killed
  checkpoint write left (remove_stale_shards);
* agree: under torchrun, what each rank found on its own disk (checkpoint, token files, tokenizer, task files)
  compared across the ranks before the first collective, so that none waits alone in one;
* Pace and Stop: when the loop reads the clock (CUDA events) and agrees on it and on stop requests; Ctrl-C /
  SIGTERM as a request to finish the step, write a checkpoint and stop;
* plot_log: the curves of one or more log.jsonl files.

Every check here is one clear line for a real mistake, raised as ValueError (train.py's main prints it).
"""
import contextlib
import datetime
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import bpe
import fineweb
import model as model_lib


def say(*args, **kw):
    """print, flushed: progress shows up at once even through a pipe or a log file."""
    try:
        print(*args, **kw, flush=True)
    except BrokenPipeError:   # the reader went away (`| head`): train on quietly, log.jsonl keeps every line
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def quiet(*args, **kw):
    """say() for the ranks other than 0."""


def fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def parse_duration(s):
    """'45m' -> 2700.0 seconds ('90s', '1.5h', '600' = seconds); '' -> None, no time budget."""
    if not s:
        return None
    s = str(s).strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(s[-1:], None)
    try:
        return float(s[:-1]) * scale if scale else float(s)
    except ValueError:
        raise ValueError(f"--time_budget: expected a duration like 45m, 90s or 1.5h, got {s!r}") from None


def check_output_paths(c):
    """--out_dir (and --data_dir where the main job's data is prepared) can be written: said before any work."""
    bpe.check_output_path(c.out_dir, "--out_dir", folder=True)
    if c.prepare_data:
        bpe.check_output_path(c.data_dir, "--data_dir", folder=True)


# -----------------------------------------------------------------------------
# token files

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
    except ValueError as e:   # not JSON, or not UTF-8 text
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
    if meta.get("tokenizer") and not meta.get("tokenizer_fingerprint"):
        raise ValueError(f"{side}: names tokenizer {meta['tokenizer']!r} but no tokenizer_fingerprint: write token "
                         f"files with bpe.py --encode or fineweb.py")
    return np.memmap(path, dtype=dtype, mode="r"), meta


def check_token_range(arr, vocab_size, path, chunk=1 << 24, max_scan=2_000_000_000):
    """A token id >= vocab_size would index past the embedding: refuse before training starts.
    Files up to max_scan tokens are scanned in full (GB/s); beyond that the sidecar's vocab_size is trusted."""
    n = min(len(arr), max_scan)
    top = max(int(arr[i:i + chunk].max()) for i in range(0, n, chunk))
    if top >= vocab_size:
        raise ValueError(f"{path}: token id {top} >= the model's vocab_size {vocab_size}")


def find_shards(data_dir, split):
    """[(path, array, sidecar), ...] of data_dir/split*.bin, in name order."""
    return [(str(f), *load_tokens(f)) for f in sorted(Path(data_dir).glob(f"{split}*.bin"))]


def check_batch_fits(shards, need, what="training data"):
    """One batch of need tokens must fit in some shard ((path, array, ...) tuples): else name the longest one."""
    path, arr = max(shards, key=lambda s: len(s[1]))[:2]
    if len(arr) < need:
        raise ValueError(f"{what} too short: {path} has {len(arr):,} tokens"
                         f"{f' (the longest of {len(shards)} files)' if len(shards) > 1 else ''}, one batch needs "
                         f"batch_size*context_length*world_size+1 = {need:,}")


@dataclass
class Data:
    """A run's token files and what decodes them. fingerprint: the tokenizer's content hash (None: no tokenizer)."""
    train: list
    val: list
    vocab_size: int
    eot_id: int
    tokenizer: object
    tokenizer_ref: str
    fingerprint: str
    tokenizer_error: str = ""   # why the tokenizer named did not load (empty when it did, or none is named)

    @property
    def train_files(self):
        """What a checkpoint records of its training data (a resume checks it, on a moved copy too): the files'
        names and sizes, in the order the sampler's position counts them."""
        return [[Path(p).name, len(a)] for p, a, _ in self.train]


def prepare_main_job(c, ddp, master, log, ckpt=None, ckpt_path=None):
    """The main job's data (stories -> BPE -> token files), made or reused by fineweb.prepare_tinystories; only
    in a folder it made, or one without its files: never over someone's own data (their train*.bin are used as
    they are, their text or tokenizer refused by prepare_tinystories). ckpt: the checkpoint this run resumes (at
    ckpt_path): while the folder holds the corpus it was trained on, another --corpus_bytes is refused before that
    data is rewritten."""
    data_dir = Path(c.data_dir)
    if not ((data_dir / "prepared.json").exists() or not any(data_dir.glob("train*.bin"))):
        return
    # the other ranks wait for rank 0 on a gloo group of their own: preparing all of TinyStories takes longer
    # than the 10 minutes NCCL allows one collective (if rank 0 fails, torchrun stops them all)
    wait = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(hours=3)) if ddp else None
    if master:
        with lock(data_dir, "train.py preparing its data") or contextlib.nullcontext():
            fineweb.prepare_tinystories(data_dir=c.data_dir, vocab_size=c.vocab_size, allow_download=c.download,
                                        fresh=c.fresh, log=log, corpus_bytes=c.corpus_bytes,
                                        flag="--data_dir (with --prepare_data=true)",
                                        keep=ckpt and (ckpt["config"].get("corpus_bytes"), (
                                            f"{ckpt_path} was trained on it: resume without the change, or start a "
                                            f"new run (another --out_dir, and --data_dir with --prepare_data=true; or "
                                            f"--fresh)")))
    if ddp:
        torch.distributed.barrier(group=wait)
        torch.distributed.destroy_process_group(wait)


def open_data(c, prepare_commands, preset_dirs, log):
    """The token files of --data_dir, checked (sidecars, one vocabulary, one tokenizer), and the tokenizer that
    decodes them (None when they name none, or it does not load: no bits/byte or samples then)."""
    train, val = find_shards(c.data_dir, "train"), find_shards(c.data_dir, "val")
    if not train:
        cmd = prepare_commands.get(c.preset)
        own = preset_dirs.get(c.preset)
        if cmd and c.data_dir != own:   # the preset's data asked for in another folder: each path in it, that one
            cmd = re.sub(rf"{re.escape(own)}(?=/|\s|$)", lambda _: shlex.quote(c.data_dir), cmd)
        how = (f"; prepare them with:\n  {cmd}" if cmd else " (make them with bpe.py --encode or fineweb.py, or "
               "pass --prepare_data=true for the main job's stories)")
        raise ValueError(f"{c.data_dir}: no train*.bin token files{how}")
    if not val:   # no separate validation split: hold out the last shard (or say so for a single file)
        if len(train) < 2:
            raise ValueError(f"{c.data_dir}: no val*.bin token file next to the train data")
        train, val = train[:-1], train[-1:]
    metas = [m for _, _, m in train + val]
    fingerprints = {m.get("tokenizer_fingerprint") for m in metas}
    if len(fingerprints) > 1:   # one tokenizer may be named by several paths: its content decides
        refs = sorted({str(m.get("tokenizer")) for m in metas})
        if len(refs) > 1:
            raise ValueError(f"{c.data_dir}: token files were written by different tokenizers {refs}")
        raise ValueError(f"{c.data_dir}: token files were written by different versions of tokenizer {refs[0]!r} "
                         f"(fingerprints {', '.join(sorted(map(str, fingerprints)))}): re-encode them all with one")
    fingerprint = fingerprints.pop()
    first = None   # (sidecar, vocab_size) of the first token file: every other one must agree
    for path, _, m in train + val:
        if "vocab_size" not in m:
            raise ValueError(f'{path}.json: missing "vocab_size"')
        if type(m["vocab_size"]) is not int or m["vocab_size"] < 1:
            raise ValueError(f'{path}.json: "vocab_size" must be a positive integer, got {m["vocab_size"]!r}')
        if first is None:
            first = (f"{path}.json", m["vocab_size"])
        elif m["vocab_size"] != first[1]:
            raise ValueError(f"{c.data_dir}: token files disagree on vocab_size ({first[0]}: {first[1]}, "
                             f"{path}.json: {m['vocab_size']})")
    vocab_size, eot_id = first[1], metas[0].get("eot_id")
    if eot_id is not None and (type(eot_id) is not int or not 0 <= eot_id < vocab_size):
        raise ValueError(f'{train[0][0]}.json: "eot_id" must be a token id in [0, {vocab_size}) or null, '
                         f"got {eot_id!r}")
    if (c.prepare_data or c.preset) and c.vocab_size < vocab_size:
        log(f"train.py: the data's vocabulary is {vocab_size} (--vocab_size={c.vocab_size}): using {vocab_size}")
    ref, tokenizer, why = metas[0].get("tokenizer"), None, ""
    if ref:
        # the tokenizer named, or the one beside the data when the folder was moved or copied with it: the one
        # named is gone, or was retrained since while the copy beside the data still matches
        beside = Path(c.data_dir) / Path(ref).name
        if ref != "gpt2" and beside.exists() and (not Path(ref).exists() or (
                bpe.tokenizer_fingerprint(ref) != fingerprint and bpe.tokenizer_fingerprint(beside) == fingerprint)):
            ref = str(beside)
        try:
            tokenizer = bpe.tokenizer_for(ref, vocab_size, fingerprint, "its token files")
        except bpe.TokenizerMismatch as e:   # bits/byte, samples, HellaSwag would all be wrong
            raise ValueError(f"{first[0]}: {e}: re-encode the data with it") from None
        except (OSError, ValueError) as e:
            why = str(e)
            log(f"train.py: tokenizer {ref!r} could not be loaded ({e}): no bits/byte or samples")
    return Data(train, val, vocab_size, eot_id, tokenizer, ref, fingerprint, why)


# -----------------------------------------------------------------------------
# the samplers that read the token files in an order a checkpoint can resume (train.py's make_loader picks one)

def batch_to_device(buf, device):
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
        if len(self.arrays) == 1:   # train.get_batch's draw (every start in one call), on this sampler's RNG
            arr = self.arrays[0]
            rows = [arr[s:s + self.T + 1] for s in self.rng.integers(0, len(arr) - self.T, size=self.B)]
        else:   # a file per row, then a start in it
            rows = []
            for i in self.rng.choice(len(self.arrays), size=self.B, p=self.p):
                s = self.rng.integers(0, len(self.arrays[i]) - self.T)
                rows.append(self.arrays[i][s:s + self.T + 1])
        return batch_to_device(torch.from_numpy(np.stack(rows).astype(np.int64)), device)

    def state_dict(self):
        return {"kind": "random", "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]


class SequentialSampler:
    """build-nanogpt-style reading: windows of B*T+1 tokens taken in order through the shards, rank r of W taking
    every W-th window. Unlike the reference, each epoch shuffles the shard order and, when the end-of-text id is
    known, the order of the documents inside each shard (documents are cut at every eot token; without one, the
    shard is rotated to a random start instead), with an RNG seeded by (seed, epoch): the position (epoch, shard,
    offset) pins the data exactly, for resume. shuffle_first_epoch=False reads the first epoch as the reference
    does, in stream order (shards in name order, documents as they are), and shuffles from the second on."""

    def __init__(self, shards, batch_size, context_length, rank=0, world_size=1, seed=0, eot_id=None, shuffle=True,
                 shuffle_first_epoch=True):
        self.shards = [(p, a) for p, a, _ in shards]
        self.B, self.T, self.rank, self.world = batch_size, context_length, rank, world_size
        self.seed, self.eot_id = seed, eot_id
        self.shuffle_every_epoch, self.shuffle_first = shuffle, shuffle_first_epoch
        self.span = batch_size * context_length   # tokens one rank consumes per batch
        check_batch_fits(self.shards, self.span * world_size + 1)
        self.epoch, self.shard, self.pos = 0, 0, 0
        self._start_epoch()

    def _start_epoch(self):
        self.shuffle = self.shuffle_every_epoch and (self.epoch > 0 or self.shuffle_first)
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
        return batch_to_device(rows, device)

    def state_dict(self):
        return {"kind": "sequential", "epoch": self.epoch, "shard": self.shard, "pos": self.pos}

    def load_state_dict(self, state):
        self.epoch, self.shard = state["epoch"], 0
        self._start_epoch()
        self.shard, self.pos = state["shard"], state["pos"]
        self._load_shard()


class ReadAhead:
    """A sampler that the loop reads one batch ahead (nanochat's order): each micro-step fetches the next batch while
    the device runs its forward, so the reading, and on CUDA the pinned copy issued non_blocking, overlap the
    compute. The sampler is called in the same order as without it, so no number changes; state_dict() is the
    position of the batch fetched last and not yet trained on, where a resumed run must start."""

    def __init__(self, sampler):
        self.sampler, self.position = sampler, None

    def next_batch(self, device):
        self.position = self.sampler.state_dict()   # (a fresh dict: the sampler's state before this batch)
        return self.sampler.next_batch(device)

    def state_dict(self):
        return self.sampler.state_dict() if self.position is None else self.position

    def load_state_dict(self, state):
        self.position = None
        self.sampler.load_state_dict(state)


# -----------------------------------------------------------------------------
# under torchrun: the ranks' decisions, agreed before the first collective

AGREE_HINT = ("every rank must start from the same command, on the same token files, tokenizer and task files, with "
              "one --out_dir (shared by the nodes: only rank 0 writes checkpoints)")


class AgreedError(ValueError):
    """The error every rank raises once agree() has compared them: the same line on each, so rank 0 alone says it."""


def agree(world, error=None, decisions=None):
    """Under torchrun, before the run's first collective: what each rank decided from its own disk or network that
    changes which collectives it enters (decisions: {what: plain value}, e.g. the checkpoint it resumes, the token
    files it found, whether its tokenizer loaded, the downstream examples it loaded), or the error that stopped its
    set-up, gathered from every rank in one all_gather_object and compared. An error on any rank, or any
    disagreement, raises the same ValueError on every rank, so that none is left waiting in a collective that the
    others never enter. In one process: its error is raised as it is."""
    if world == 1:
        if error is not None:
            raise error
        return
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, (None if error is None else str(error), decisions or {}))
    said = _disagreement(everyone)
    if said is not None:   # every rank stops here with the same error: they leave gloo together (one process
        torch.distributed.barrier()   # exiting while its peer still holds the group aborts the peer now and then)
        torch.distributed.destroy_process_group()
        raise AgreedError(said)


def _disagreement(everyone):
    """The one error every rank raises, from each rank's (error or None, decisions): the first rank's error (as it
    is when every rank met the same one), else the first decision a rank takes otherwise than rank 0; None if
    they agree."""
    world = len(everyone)
    failed = [r for r, (e, _) in enumerate(everyone) if e is not None]
    if failed:
        first = everyone[failed[0]][0]
        if len(failed) == world and all(everyone[r][0] == first for r in failed):
            return first
        head, sep, tail = first.partition("\n")
        others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"{head} (on rank {failed[0]}{others} of {world}){sep}{tail}"
    for what, value in everyone[0][1].items():   # (rank 0's as the reference: every rank words it the same)
        for r, (_, theirs) in enumerate(everyone[1:], 1):
            if theirs.get(what) != value:
                return (f"the {world} processes disagree on {what}: {_shown(value)} on rank 0, "
                        f"{_shown(theirs.get(what))} on rank {r}: {AGREE_HINT}")
    return None


def _shown(value, width=100):
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


# -----------------------------------------------------------------------------
# resume

def files_summary(files):
    """[[name, tokens], ...] -> "2 file(s) of 1,005 tokens"."""
    return f"{len(files)} file(s) of {sum(n for _, n in files):,} tokens"


def resume_settings(cfg, explicit, defaults, presets, resumable):
    """main()'s resume: (settings, checkpoint) -- the checkpoint's settings with what this command line gives
    explicitly on top -- or (cfg, None) when this is a new run. A change to a setting outside `resumable` would
    not continue the same run: refused in one line."""
    ckpt_path = Path(cfg["out_dir"]) / "ckpt.pt"
    resume = cfg["resume"]
    if resume is True and not ckpt_path.exists():
        raise ValueError(f"--resume: no checkpoint at {ckpt_path}")
    if resume is False or cfg["fresh"] or not ckpt_path.exists():
        return cfg, None
    try:
        ckpt = read_train_checkpoint(ckpt_path, run=True)
    except ValueError as e:
        raise ValueError(f"{e} (use --fresh to start over)") from None
    old = ckpt["config"]
    asked = set(explicit)   # what this command line sets; a preset's settings only when it names another one
    if cfg["preset"] != old.get("preset", ""):
        asked |= set(presets.get(cfg["preset"], {}))
    if "data_dir" in asked:   # a folder named on the command line is prepared only when that command line says so,
        asked.add("prepare_data")   # never because the checkpoint's run prepared its own
    changed = {k: (old.get(k), cfg[k]) for k in asked if k not in resumable and old.get(k) != cfg[k]}
    if changed:
        what = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
        raise ValueError(f"{ckpt_path} holds a run with other settings ({what}): use --fresh to start over or "
                         f"another --out_dir")
    # --resume and --fresh are this command's: a --fresh first run does not start over again, an old --resume=true
    # does not make this --resume=auto continue another run
    return {**defaults, **old, **{k: cfg[k] for k in asked}, "resume": resume, "fresh": False}, ckpt


def check_same_run(ckpt, data, c, ckpt_path):
    """--resume=auto continues out_dir's checkpoint only when it is the same run: trained on these token files (names
    and sizes, in order) under this tokenizer. Another run there stops this one before any work, with the ways on;
    --resume=true goes on (restore() continues the model on this data, if it can read it)."""
    trained_with = ckpt.get("tokenizer_fingerprint")
    if c.resume is True or (ckpt["train_files"] == data.train_files and trained_with == data.fingerprint):
        return
    vocab = ckpt["model_config"].get("vocab_size")   # what check_model_fits would refuse under --resume=true:
    cannot = (f"its model's {vocab:,} ids are not this data's {data.vocab_size:,}" if vocab != data.vocab_size else
              "its model was trained on another tokenizer's ids" if data.fingerprint not in (None, trained_with)
              else None)
    ways = (f"use another --out_dir, or --fresh to replace it ({cannot})" if cannot else
            "use another --out_dir, --fresh to replace it, or --resume=true to continue it on this data")
    raise ValueError(f"{ckpt_path} holds another run, trained on {ckpt['config'].get('data_dir')} "
                     f"({files_summary(ckpt['train_files'])}), not on {c.data_dir} ({files_summary(data.train_files)})"
                     f": {ways}")


RUN_KEYS = ("config", "model_config", "train_files", "loader", "rng", "elapsed", "val_loss", "val_step")


def read_train_checkpoint(src, run=False):
    """model.read_checkpoint (one clear line when the file is broken), and it must be one of train.py's; with run,
    a run's (save_run's, which a resume continues), not only weights (save_checkpoint's)."""
    ckpt = model_lib.read_checkpoint(src)
    name = src if isinstance(src, (str, os.PathLike)) else getattr(src, "name", "<file object>")
    if "model" not in ckpt or "iteration" not in ckpt:
        raise ValueError(f"{name}: not a train.py checkpoint (expected a dict with 'model' and 'iteration')")
    missing = [key for key in RUN_KEYS if key not in ckpt] if run else []
    if missing:
        raise ValueError(f"{name}: weights, not a train.py run's checkpoint (no {', '.join(map(repr, missing))}): "
                         f"a run cannot continue from it")
    return ckpt


def checkpoint_not_written(path, step, e):
    """The one line for a checkpoint that could not be written (a full disk): what, why, the checkpoint kept (the
    write goes to a temp file, renamed only once whole) and how to go on."""
    try:
        kept = (f"the one of step {torch.load(path, mmap=True, weights_only=True)['iteration']} is kept: free at "
                f"least its {Path(path).stat().st_size / 1e6:,.1f} MB there, then continue with --resume")
    except FileNotFoundError:
        kept = "there is no earlier one: free some space there, then run the command again"
    except Exception:   # (not expected: the last rename put a whole checkpoint there)
        kept = "the earlier one is kept: free some space there, then continue with --resume"
    return ValueError(f"{path}: could not write the checkpoint of step {step} ({bpe.write_error(e)}); {kept}")


def model_of(ckpt, ckpt_path):
    """The model a resumed checkpoint holds; one clear line when its weights do not fit its model_config."""
    try:
        return model_lib.model_from_checkpoint(ckpt)
    except ValueError as e:
        raise ValueError(f"{ckpt_path}: {e}") from None


def check_model_fits(raw, data, c, ckpt, ckpt_path):
    """A checkpoint's or released weights' model against this data: the same vocabulary, the same tokenizer
    (a same-size tokenizer of other tokens would go unnoticed otherwise), every id in range, the context."""
    if raw.vocab_size != data.vocab_size:   # its ids must mean the data's tokens
        source = f"--init_from={c.init_from}" if ckpt is None else str(ckpt_path)
        raise ValueError(f"{source}: the model has a vocabulary of {raw.vocab_size:,} ids, the data in {c.data_dir} "
                         f"{data.vocab_size:,} (tokenizer {data.tokenizer_ref!r}): tokenize the data with the model's "
                         f"tokenizer" + ("" if ckpt is None else ", or start a new run with --fresh"))
    trained_with = ckpt.get("tokenizer_fingerprint") if ckpt is not None else None
    if trained_with and data.fingerprint not in (None, trained_with):
        raise ValueError(f"{ckpt_path}: trained on ids of tokenizer fingerprint {trained_with}, but the data in "
                         f"{c.data_dir} was encoded with {data.fingerprint} (tokenizer {data.tokenizer_ref!r}): "
                         f"resume on the data it was trained on, or start a new run with --fresh")
    for path, arr, _ in data.train + data.val:   # an id >= vocab_size is refused before training starts
        check_token_range(arr, raw.vocab_size, path)
    if c.context_length > raw.context_length:
        raise ValueError(f"--context_length={c.context_length} is longer than the model's {raw.context_length}")


@dataclass
class RunState:
    """What the loop carries from step to step, and a checkpoint saves (besides weights, optimizer, loader, RNGs):
    the step, the training time spent, and the last validation loss with the step it was measured at."""
    step: int = 0
    elapsed: float = 0.0
    val_loss: float = None
    val_step: int = None

    def finished(self, max_iters, budget):
        """The run's end: max_iters steps, or the time budget (seconds, None: none) spent."""
        return self.step >= max_iters or (budget is not None and self.elapsed >= budget)

    def time_left(self, max_iters, budget, step_time):
        """Training time to the run's end: the steps left at the recent step time, or the budget left if sooner
        (evaluations and checkpoints come on top)."""
        left = max(0, max_iters - self.step) * step_time
        return left if budget is None else max(0.0, min(left, budget - self.elapsed))

    def evaluation_due(self, interval, end):
        """Whether the loop evaluates now: every `interval` steps and at the run's end (end), but not at a step
        already evaluated (a resumed checkpoint's own step, whose evaluation its log holds)."""
        return (self.step % interval == 0 or end) and self.val_step != self.step

    def checkpoint_due(self, interval, last, start_step):
        """Whether the loop writes a checkpoint now: every `interval` steps trained since this process started at
        start_step, and at its last step (the run's end or a stop) unless it trained none (it would rewrite the
        checkpoint it resumed; a new run's step 0 is written)."""
        trained = self.step > start_step
        return (trained and self.step % interval == 0) or (last and (trained or self.step == 0))


SCHEDULE_LENGTH = ("time_budget", "max_iters", "lr_decay_iters")   # resumable: a resume may lengthen the schedule


def schedule_length(config):
    """The settings of a run (a checkpoint's "config") that set its learning-rate schedule's length."""
    return {k: config[k] for k in SCHEDULE_LENGTH}


def restore(ckpt, ckpt_path, raw, optimizer, loader, c, data, world, rank, fused, lrs, log):
    """Load a checkpoint into this run -- weights, optimizer, the loader's position, every RNG -- after checking
    that it continues the same run (the same number of processes, but for an FSDP run's); returns its RunState. On
    other training files (--resume=true) the loader starts at their beginning. Says what a resume changes in the
    learning-rate schedule; lrs: (then, now), the learning rate at the checkpoint's step and training time under
    its run's schedule_length settings and under this run's (train.py's scheduled_lr)."""
    same_data = ckpt["train_files"] == data.train_files   # names and sizes, in the sampler's order
    if "shards" in ckpt:   # an FSDP run's (train.py --fsdp): sharded, and resumable on any number of processes
        position, rng = restore_shards(ckpt, ckpt_path, raw, optimizer, loader, fused, world, rank, log)
    else:
        for group in ckpt["optimizer"]["param_groups"]:   # torch places each state's "step" by the loaded groups'
            group["fused"] = fused   # flags: on the device for fused AdamW, on the CPU (no sync per .item()) for ours
        model_lib.unwrap(raw).load_state_dict(model_lib.unwrapped_state_dict(ckpt["model"]))
        optimizer.load_state_dict(ckpt["optimizer"])
        saved_world = len(ckpt["loader"]) if isinstance(ckpt["loader"], list) else 1
        if same_data and saved_world != world:
            raise ValueError(f"{ckpt_path} was written by {saved_world} process(es): resume it with the same number "
                             f"(this run has {world}) so every rank continues its own data stream")
        position = ckpt["loader"][rank] if isinstance(ckpt["loader"], list) and same_data else ckpt["loader"]
        rng = ckpt["rng"]
    try:
        if same_data:
            loader.load_state_dict(position)
    except (IndexError, KeyError, TypeError, ValueError):   # e.g. a shard that is no longer there
        raise ValueError(f"{ckpt_path}: its data position does not exist in {c.data_dir} ({len(data.train)} "
                         f"training file(s)): the data changed since the checkpoint; resume with the same data, "
                         f"or start over with --fresh") from None
    set_rng_state(rng)
    state = RunState(int(ckpt["iteration"]), ckpt["elapsed"], ckpt["val_loss"], ckpt["val_step"])
    log(f"resumed {ckpt_path} at step {state.step}")
    if not same_data:   # --resume=true on other token files (check_same_run stops --resume=auto): the model, the
        # optimizer and the schedule go on; the loader starts at the new files' beginning, and their validation loss
        # is measured anew (the checkpoint's was on other text)
        state.val_loss = state.val_step = None
        log(f"train.py: {ckpt_path} continues on other data: {c.data_dir} holds {files_summary(data.train_files)}, "
            f"its run trained on {files_summary(ckpt['train_files'])}: reading starts at their beginning")
    budget = parse_duration(c.time_budget)
    if state.finished(c.max_iters, budget):   # nothing to train: say how to go on
        spent = (f"its --max_iters={c.max_iters}" if state.step >= c.max_iters else
                 f"its --time_budget={c.time_budget} ({fmt_time(state.elapsed)} trained)")
        log(f"train.py: {ckpt_path} has already reached {spent}: pass a larger --max_iters or --time_budget to "
            f"train on, or --fresh to start over")
    old = ckpt["config"]
    decay, old_decay = c.lr_decay_iters or c.max_iters, old["lr_decay_iters"] or old["max_iters"]
    clocked = bool(c.time_budget or old["time_budget"])
    if state.step > 0 and old_decay != decay and not clocked:   # e.g. a larger --max_iters
        log(f"train.py: the cosine now ends at step {decay:,}, not {old_decay:,} as in the checkpoint's run, so "
            f"the learning rate jumps at step {state.step:,} (pass --lr_decay_iters={old_decay} to keep its schedule)")
    # under a budget the clock is mapped onto max_iters as well: no flag keeps the schedule while extending the
    # run, so say what the change does to the learning rate
    changed = [f"--{k} {old[k] if old[k] != '' else 'none'} -> {c[k] if c[k] != '' else 'none'}"
               for k in SCHEDULE_LENGTH if old[k] != c[k]]
    if state.step > 0 and changed and clocked:
        was, now = lrs
        if f"{now:.3g}" != f"{was:.3g}":
            log(f"train.py: under --time_budget the schedule maps the clock onto --max_iters; with "
                f"{', '.join(changed)} the learning rate at step {state.step:,} is {now:.3g}, not {was:.3g} as in "
                f"the checkpoint's run")
    return state


def restore_shards(ckpt, ckpt_path, raw, optimizer, loader, fused, world, rank, log):
    """An FSDP checkpoint's weights and optimizer state, loaded with torch.distributed.checkpoint, which reshards
    them to this run's processes; returns (this rank's loader position, its RNG states).
    On another number of processes, the data: the sequential sampler's position is the stream's (the same on every
    rank), and each rank reads every world-th window from it, so the run goes on from the first window not read;
    with the same --total_batch_tokens each step takes the windows the run would have taken (to the end of the
    shard being read, where a step's last windows may be cut another way). The random sampler: rank r continues
    rank r's stream, and a rank the checkpoint has none for starts its own. A rank it has no RNGs for takes rank
    0's (the same on every rank after the seed, and only sampling draws from them)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    folder = Path(ckpt_path).parent / ckpt["shards"]
    model_lib.check_shards_metadata(folder)   # nothing in the folder is executed
    shards = {"model": get_model_state_dict(raw)}
    if ckpt["config"].get("ema"):   # --ema's: "model" is the weight average, the weights trained are beside it
        shards["trained_weights"] = {n: p.detach().clone() for n, p in raw.named_parameters()}
    if ckpt["optimizer_groups"] is not None:   # (None: written before the optimizer's first step)
        opt = get_optimizer_state_dict(raw, optimizer)
        shards["optimizer"] = opt["state"]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is")
            dcp.load(shards, checkpoint_id=folder, no_dist=world == 1)
    except (Exception, dcp.api.CheckpointException) as e:   # (DCP's own is a BaseException)
        raise model_lib.shards_unreadable(folder, e) from None
    set_model_state_dict(raw, shards["model"])
    if "trained_weights" in shards:   # (train() puts them in the model: ckpt holds them as a whole checkpoint would)
        ckpt["trained_weights"] = shards["trained_weights"]
    if "optimizer" in shards:
        groups = [dict(group, fused=fused) for group in ckpt["optimizer_groups"]]   # (see restore)
        set_optimizer_state_dict(raw, optimizer, dict(state=shards["optimizer"], param_groups=groups))
    saved = len(ckpt["loader"])
    if saved != world:
        log(f"train.py: {ckpt_path} was written by {saved} process(es), this run has {world}: the weights and the "
            f"optimizer state are resharded, and the data continues at its position (README: Past one GPU)")
    if rank < saved:
        return ckpt["loader"][rank], ckpt["rng"][rank]
    mine = ckpt["loader"][0] if ckpt["loader"][0]["kind"] == "sequential" else loader.state_dict()
    return mine, ckpt["rng"][0]


def remove_stale_shards(ckpt_path):
    """Remove the folders of FSDP shards beside ckpt_path (ckpt.pt.shards-*) that it does not name: a checkpoint
    replaced since, or one whose write a crash cut short (GBs at scale). An unreadable ckpt_path keeps them all."""
    ckpt_path = Path(ckpt_path)
    keep = None
    if ckpt_path.is_file():
        try:   # (mmap: a whole-model checkpoint's tensors are not read)
            keep = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True).get("shards")
        except Exception:
            return
    for folder in ckpt_path.parent.glob(f"{ckpt_path.name}.shards-*"):
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


def rng_state():
    """Every RNG as tensors and plain types (loadable with weights_only=True)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss]}
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
        torch.cuda.set_rng_state(state["cuda"])


# -----------------------------------------------------------------------------
# the run's folder: lock, log, wandb

def lock(folder, what):
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


def kept_on_resume(line, step):
    """Whether a log.jsonl line stays when a run resumes at `step`: the records up to it, not a line that a crash
    tore mid-write."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("step", 0) <= step


class RunDir:
    """out_dir, held by one run (rank 0; on the other ranks every method does nothing): the lock, log.jsonl and
    wandb. A resumed run keeps the log's records up to its step; a new run replaces the old run's log and
    checkpoint, so a crash before its first checkpoint cannot mix the two runs."""

    def __init__(self, c, resumed_at, master, log):
        self.out_dir, self.log_path = Path(c.out_dir), Path(c.out_dir) / "log.jsonl"
        self.ckpt_path = self.out_dir / "ckpt.pt"
        self.logf = self.lock = self.wandb = None
        if not master:
            return
        self.lock = lock(self.out_dir, "training run")
        for stale in self.out_dir.glob(f"{self.ckpt_path.name}.tmp*"):   # a save cut short by a hard kill (SIGKILL
            stale.unlink(missing_ok=True)                                  # skips the cleanup): GBs at GPT-2 scale
        if resumed_at is not None and self.log_path.exists():   # drop what a crashed run logged after its checkpoint
            kept = [line for line in self.log_path.read_text().splitlines() if kept_on_resume(line, resumed_at)]
            tmp = self.log_path.with_name(self.log_path.name + ".tmp")   # renamed over the log: a crash now leaves
            with open(tmp, "w") as f:                                      # the old log or the new, never neither
                f.writelines(line + "\n" for line in kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.log_path)
            self.logf = open(self.log_path, "a")
        else:
            if resumed_at is None and self.ckpt_path.exists():
                self.ckpt_path.unlink()
                log(f"train.py: starting over in {self.out_dir}: removed the previous run's checkpoint")
            self.logf = open(self.log_path, "w")
        remove_stale_shards(self.ckpt_path)   # (FSDP's: those of a replaced checkpoint, or of a write cut short)
        if c.wandb:
            try:
                import wandb
                self.wandb = wandb.init(project=c.wandb_project, config=dict(c), resume="allow")
            except ImportError:
                log("train.py: --wandb given but wandb is not installed (pip install wandb): logging locally only")

    def record(self, kind, **fields):
        """One line of log.jsonl (and the numbers to wandb)."""
        if self.logf is not None:
            try:
                self.logf.write(json.dumps({"type": kind, **fields}) + "\n")
                self.logf.flush()
            except OSError as e:   # a full disk
                raise ValueError(f"{self.log_path}: could not write the log ({bpe.write_error(e)}): "
                                 f"free some space, then continue with --resume") from None
        if self.wandb is not None:
            self.wandb.log({f"{kind}/{k}": v for k, v in fields.items() if isinstance(v, (int, float))},
                           step=fields.get("step"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.logf, self.lock):
            if f is not None:
                f.close()
        if self.wandb is not None:
            self.wandb.finish()


# -----------------------------------------------------------------------------
# stop requests

class Stop:
    """A stop request, Ctrl-C (SIGINT) or SIGTERM (a scheduler's preemption notice; torchrun passes either on to its
    workers): finish the step, write a checkpoint, stop. In one process a second request aborts at once. Under
    torchrun a worker gets a terminal's Ctrl-C twice (from the terminal and again from torchrun), so repeats are
    ignored there, even after the loop (the repeat can arrive late, during the teardown): torchrun kills its
    workers itself --shutdown_timeout seconds (30) after the first signal.

    Under DDP every rank must stop at the same step: `pending` is the request the loop acts on, in one process
    the signal's at once, under DDP the one every rank agreed on at the last read of the clock (agree(), when
    Pace says: every log_interval steps)."""
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

    def __init__(self, ddp, master):
        self.ddp, self.agreed = ddp, None
        Stop.requested, Stop.repeat_aborts, Stop.quiet = None, not ddp, not master

    @property
    def pending(self):
        return self.agreed if self.ddp else Stop.requested

    def agree(self, elapsed, step_time, master, device):
        """Under DDP, every rank takes rank 0's clock (for the budget and the schedule) and recent step time (for
        the next read, Pace), and whether any rank was asked to stop: one all-reduce."""
        if not self.ddp:
            return elapsed, step_time
        t = torch.tensor([elapsed if master else 0.0, step_time if master else 0.0, Stop.requested is not None],
                         dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        elapsed, step_time, asked = t.tolist()
        self.agreed = (Stop.requested or "a stop request on another rank") if asked else None
        return elapsed, step_time

    def __enter__(self):
        main_thread = threading.current_thread() is threading.main_thread()
        sigs = [getattr(signal, n) for n in ("SIGINT", "SIGTERM") if hasattr(signal, n)] if main_thread else []
        self.old = {sig: signal.signal(sig, Stop.handler) for sig in sigs}
        return self

    def __exit__(self, *exc):
        for sig, old in self.old.items():   # the caller's handlers are back; but a torchrun worker that got a
            signal.signal(sig, signal.SIG_IGN if self.ddp and Stop.requested else old)   # signal may get its repeat


class Pace:
    """When the loop reads its clock and, under DDP, agrees on it and on stop requests (Stop.agree: rank 0's clock,
    any rank's request). In one process on the CPU, after every step: reading the clock costs nothing there, so
    --time_budget runs are exact. On CUDA, or under DDP, a read is a sync (the GPU drains its queue; the ranks meet),
    so it comes only every log_interval steps, and after the steps whose end needs the clock: an evaluation, a
    checkpoint, max_iters, a stop request in one process, and the step at which the time budget runs out by the
    recent step time. Between reads the schedule and the budget see the clock of the last read, at most
    log_interval steps old. Each step is timed by `clock` read as it starts and ends, on CUDA by a pair of CUDA
    events instead (read at the next sync, so timing a step costs no sync of its own)."""

    def __init__(self, clock, device, ddp, c, budget, ckpt_every):
        self.clock, self.cuda, self.ddp, self.budget = clock, device.type == "cuda", ddp, budget
        self.every_step = not (self.cuda or ddp)
        self.intervals, self.max_iters = (c.log_interval, c.eval_interval, ckpt_every), c.max_iters
        self.steps, self.step_time, self.budget_step = [], None, 0 if budget is not None else math.inf

    def _now(self):
        if not self.cuda:
            return self.clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step_started(self):
        self.t0 = self._now()

    def step_ended(self, counted=True):
        """counted=False: a step whose time is not training (a compiled run's first, mostly compilation)."""
        self.steps.append((self.t0, self._now(), counted))

    def due(self, step, stop):
        """Whether the clock is read after this step (the same answer on every rank)."""
        return (self.every_step or step >= self.max_iters or step >= self.budget_step
                or any(step % n == 0 for n in self.intervals) or (not self.ddp and stop.pending is not None))

    def read(self, state, stop, master, device):
        """Add the training time of the steps since the last read to state.elapsed, agree (Stop.agree), and plan the
        read at which the budget may run out; returns the last step's seconds."""
        if self.cuda:
            self.steps[-1][1].synchronize()
        for t0, t1, counted in self.steps:
            dt = t0.elapsed_time(t1) / 1000 if self.cuda else t1 - t0
            if counted:
                state.elapsed += dt
            self.step_time = dt if self.step_time is None else 0.9 * self.step_time + 0.1 * dt   # recent
        self.steps = []
        state.elapsed, self.step_time = stop.agree(state.elapsed, self.step_time, master, device)
        if self.budget is not None:   # the steps that fit in the budget left, at the recent step time
            left = (self.budget - state.elapsed) / self.step_time if self.step_time > 0 else 0
            self.budget_step = state.step + max(1, math.ceil(left))
        return dt


# -----------------------------------------------------------------------------
# plots

def read_log(path):
    """The records of a log.jsonl: (config record or {}, train records, eval records). Records missing a figure
    (hand-edited logs) are left out rather than failing the plot; a file that is no log is one ValueError."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise ValueError(f"--plot {path}: no such file") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise ValueError(f"--plot {path}: not a text file (expected a log.jsonl)") from None
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line) if line.strip() else {})
        except json.JSONDecodeError:
            raise ValueError(f"--plot {path} line {n}: not JSON") from None
        if not isinstance(rows[-1], dict):
            raise ValueError(f"--plot {path} line {n}: not a JSON object")
    config = next((r for r in rows if r.get("type") == "config"), {})
    train = [r for r in rows if r.get("type") == "train" and all(k in r for k in ("step", "elapsed", "loss"))]
    evals = [r for r in rows if r.get("type") == "eval" and all(k in r for k in ("step", "elapsed", "val_loss"))]
    if not train:
        raise ValueError(f"{path}: no training records to plot")
    return config, train, evals


def _smooth(xs):
    """A centred running mean over about 1/15 of the points: no lag, unlike an exponential average."""
    half = max(1, len(xs) // 30)
    windows = (xs[max(0, i - half):i + half + 1] for i in range(len(xs)))
    return [sum(w) / len(w) for w in windows]


def _run_label(path, config):
    """A run's name (its folder, or the log's name) and what it is: model, shape, batch, learning rate."""
    mc = config.get("model_config") or {}
    shape = f"{mc.get('num_layers', mc.get('n_layer'))}x{mc.get('d_model', mc.get('n_embd'))}" if mc else ""
    what = ", ".join(str(x) for x in (mc.get("arch"), shape, config.get("params") and
                                      f"{config['params'] / 1e6:.2f}M params",
                                      config.get("batch_size") and f"batch {config['batch_size']}",
                                      config.get("learning_rate") and f"lr {config['learning_rate']:g}") if x)
    path = Path(path)
    return (path.parent.name if path.name == "log.jsonl" else path.stem) or str(path), what


def _differences(configs):
    """For each run, the settings (and model fields) in which it differs from the first: what an overlay compares."""
    skip = {"type", "out_dir", "data_dir", "plot", "fresh", "resume", "preset", "wandb", "wandb_project", "device",
            "num_threads", "resumed_at_step", "tokenizer", "world_size", "params", "model_config", "used"}
    flat = [{**{k: v for k, v in c.items() if k not in skip}, **(c.get("model_config") or {})} for c in configs]
    return [", ".join(f"{k}={f.get(k)}" for k in sorted(f) if repr(f.get(k)) != repr(flat[0].get(k))) for f in flat]


def plot_log(paths):
    """One PNG of the curves of one or more runs' log.jsonl (comma-separated): training loss (smoothed, the raw
    figures faint) and validation loss against steps and against training time on a log scale, the learning rate,
    and validation bits per byte where logged; several runs overlay, one colour each, for comparing ablations.
    Written beside the first log as curves.png (one run) or compare.png; returns its path."""
    given, paths = paths, [os.path.expanduser(p) for p in str(paths).split(",") if p]
    if not paths:
        raise ValueError(f"--plot {given}: expected one or more log.jsonl files, comma-separated")
    runs_ = [(p, *read_log(p)) for p in paths]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (by_step, by_time), (lr_ax, bpb_ax) = axes
    differences = _differences([c for _, c, _, _ in runs_])
    for i, (path, config, train, evals) in enumerate(runs_):
        colour, (name, what) = f"C{i}", _run_label(path, config)
        label = f"{name}: {differences[i] or 'the reference'}" if len(runs_) > 1 else name
        for ax, x in ((by_step, "step"), (by_time, "elapsed")):
            xs = [r[x] / (60 if x == "elapsed" else 1) for r in train]
            ax.plot(xs, [r["loss"] for r in train], color=colour, alpha=0.25, lw=0.8)
            ax.plot(xs, _smooth([r["loss"] for r in train]), color=colour, lw=1.5, label=label)
            if evals:
                ax.plot([r[x] / (60 if x == "elapsed" else 1) for r in evals], [r["val_loss"] for r in evals], "o--",
                        color=colour, ms=4)
        lr_ax.plot([r["step"] for r in train if "lr" in r], [r["lr"] for r in train if "lr" in r], color=colour,
                   label=name)
        bpb = [r for r in evals if r.get("val_bpb")]
        if bpb:
            bpb_ax.plot([r["step"] for r in bpb], [r["val_bpb"] for r in bpb], "o-", color=colour, label=name)
    for ax, xlabel, ylabel, title in (
            (by_step, "step", "loss (nats/token, log scale)", "loss by step (line: training, dots: validation)"),
            (by_time, "training time (min)", "loss (nats/token, log scale)", "loss by training time"),
            (lr_ax, "step", "learning rate", "learning rate"),
            (bpb_ax, "step", "validation bits per byte", "validation bits per byte")):
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.grid(alpha=0.3, which="both")
    for ax in (by_step, by_time):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    (lr_ax if len(runs_) > 1 else by_step).legend(*by_step.get_legend_handles_labels(), fontsize=8)
    if not bpb_ax.lines:
        bpb_ax.text(0.5, 0.5, "no bits/byte in these logs (data without a tokenizer)", ha="center", va="center",
                    transform=bpb_ax.transAxes)
    name, what = _run_label(*runs_[0][:2])
    fig.suptitle(f"{name}: {what}" if len(runs_) == 1 else f"{len(runs_)} runs against {name} ({what})")
    fig.tight_layout()
    out = Path(paths[0]).with_name("curves.png" if len(runs_) == 1 else "compare.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [str(out)]
