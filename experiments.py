"""
The seed write-up's TinyStories experiments, rerun through train.py: a learning-rate sweep, batch sizes, the four
architecture ablations, a fixed-wall-clock run, and samples from the best model. Results land in results/
(the cpu preset on its own data), or results/<preset>[-<data folder's path>][-<N>steps]/ for another preset,
--data_dir or --steps, so runs on different data never share one report.

    python experiments.py run                   # everything, CPU scale (~2 MB of TinyStories, ~40 min on 2 cores)
    python experiments.py report                # results/results.md + PNGs from results/logs/*.jsonl alone
    python experiments.py list                  # the runs of a preset and the train.py command of each
    python experiments.py run --all             # also the extras (a second seed, ablations at the best lr, ...)
    python experiments.py run --only=baseline,nope   # some runs (names from `list`), in that order
    python experiments.py run --steps=400       # longer runs (batch-size runs keep tokens equal, the time-budget
                                                # run its share of the clock)
    python experiments.py run --train=a.txt --valid=b.txt   # the cpu preset on other text (default: the first 2 MiB
                                                # and 1,000 validation stories of TinyStories, fetched once)
    python experiments.py run --preset=cs336    # the CS336 baseline shape on full TinyStories (a GPU; needs the
                                                # data train.py's tinystories preset prints how to prepare)

`run` does three things, each reused when already done:
1. data: a bpe.py tokenizer trained on the training text, and both texts encoded into data/experiments/<preset>/
   (train.bin / val.bin) -- the cpu preset; cs336 (or --data_dir) uses a prepared folder instead;
2. runs: `python train.py --key=value ...` one after the other (never two at once: they would share the cores
   and the wall times would mean nothing), each in its own scratch folder data/experiments/<preset>/runs/<name>/
   (checkpoints stay there, out of git); its small log.jsonl is copied to results/logs/<name>.jsonl with one
   extra "experiment" record (name, groups, flags, data, wall time). A run whose results/logs file holds the
   same flags on the same data (token files' sizes and tokenizer) is not run again (--rerun forces it);
3. samples: sample.py on the best run's checkpoint (when it is the one its log describes), temperature 0.8,
   top-p 0.9 -> results/samples.txt;
then `report`.

Every run of a preset has the same seed and the same step budget (the batch-size runs: the same token budget),
so the numbers compare; wall times depend on the machine and its load and are reported, not controlled.
"""

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import bpe

ROOT = Path(__file__).resolve().parent
RESULTS_ROOT = ROOT / "results"   # the cpu preset's write-up; other presets and data get a folder inside
RESULTS = RESULTS_ROOT
LOGS = RESULTS / "logs"
FLAGS = []   # the flags that chose RESULTS (--preset, --data_dir, --steps), for the commands messages suggest

# ----------------------------------------------------------------------------------------------------------------------
# presets: the data, the baseline's train.py flags, and what each group varies

PRESETS = {
    # CPU scale, sized for 2 cores: ~0.8 M tokens per run (200 steps x 32 x 128), ~2-3 min each unloaded
    "cpu": dict(
        # None: the TinyStories head that fineweb.tinystories_head fetches once (the first 2 MiB of the train split,
        # the first 1,000 validation stories), or --train / --valid
        train_text=None, val_text=None,
        # 2 MB of text has only ~7k distinct words: at 2048 ids BPE already has ~300 tokens seen < 10 times, and a
        # larger vocabulary would put most of a 1 M-parameter model into rarely trained embedding rows
        vocab_size=2048,
        data_dir=None,   # built by prepare_data in data/experiments/cpu
        base=dict(context_length=128, d_model=128, num_layers=4, num_heads=4, d_ff=0, batch_size=32,
                  learning_rate=3e-3, min_lr_ratio=0.1, warmup_iters=20, max_iters=200, weight_decay=0.1,
                  grad_clip=1.0, sampler="random", eval_interval=100, num_threads=1),
        eval_tokens=65_536,          # every run scores the same first 64 Ki validation tokens
        # with the baseline's 3e-3: seven values from divergent (1.0; 0.1 only stalls thanks to clipping) to slow
        lrs=[1e-1, 3e-4, 1e-2, 1e-3, 3e-2, 1.0],
        batch_sizes=[16, 64],        # with the baseline's 32; lr scaled by sqrt(B / 32) (the Adam rule of thumb)
        extra_batch_sizes=[128],     # run last, only when asked for by name or with --all
        time_budget="2.5m",
        ablation_lr=1e-2,            # extras: the four ablations again at the sweep's best lr (baseline = lr_1e-2)
    ),
    # the CS336 baseline shape (SPEC: vocab 10k, ctx 256, 4 x 512, 16 heads, d_ff 1344, 5000 steps x 32)
    "cs336": dict(
        train_text=None, val_text=None, vocab_size=10000,
        data_dir="data/tinystories-10k",   # see `python train.py --preset=tinystories` for how to prepare it
        base=dict(context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344, rope_theta=10000.0,
                  batch_size=32, learning_rate=1e-3, min_lr_ratio=0.1, warmup_iters=100, max_iters=5000,
                  weight_decay=0.1, grad_clip=1.0, sampler="random", eval_interval=500),
        eval_tokens=327_680,
        lrs=[3e-2, 1e-4, 3e-3, 3e-4, 1e-2],
        batch_sizes=[64, 128],
        extra_batch_sizes=[256],
        time_budget="45m",
        ablation_lr=None,
    ),
}

ABLATIONS = [   # (name, what changes, flags): the four rows of the reference table
    ("nope", "no position embedding (NoPE)", dict(remove_rope=True)),
    ("post_norm", "post-norm blocks", dict(use_post_norm=True)),
    ("no_rmsnorm", "no RMSNorm anywhere", dict(remove_rmsnorm=True)),
    ("silu_ffn", "SiLU FFN, d_ff = 4 d_model", dict(ffn_type="silu", d_ff="4x")),
]


def _lr_name(lr):
    return "lr_" + f"{lr:.0e}".replace("e-0", "e-").replace("+0", "")


def plan(preset_name, steps=None):
    """The ordered list of runs: dict(name, groups, change, flags). The baseline comes first, then by priority."""
    p = PRESETS[preset_name]
    base = dict(p["base"])
    if steps:   # the schedule keeps its shape: warmup and evaluations at the same fractions of the run
        base["warmup_iters"] = base["warmup_iters"] * steps // base["max_iters"]
        base["eval_interval"] = max(1, base["eval_interval"] * steps // base["max_iters"])
        base["max_iters"] = steps
    budget = p["time_budget"]
    if steps:   # the clock-limited run too: its budget scales with the baseline's steps
        seconds = float(budget[:-1]) * {"s": 1, "m": 60, "h": 3600}[budget[-1]] * steps / p["base"]["max_iters"]
        budget = f"{seconds:g}s"
    B0, lr0, S0 = base["batch_size"], base["learning_rate"], base["max_iters"]
    base["eval_iters"] = max(1, p["eval_tokens"] // (B0 * base["context_length"]))
    base["time_budget"] = ""   # step-counted, not time-limited
    runs = [dict(name="baseline", groups=["lr", "batch", "ablation", "time"], change="baseline", flags=dict(base))]

    def add(name, groups, change, **over):
        runs.append(dict(name=name, groups=groups, change=change, flags={**base, **over}))

    for name, change, over in ABLATIONS:
        if over.get("d_ff") == "4x":
            over = {**over, "d_ff": 4 * base["d_model"]}
        add(name, ["ablation"], change, **over)
    for lr in p["lrs"]:
        add(_lr_name(lr), ["lr"], f"lr {lr:g}", learning_rate=lr)
    # the same training curve as the baseline, but the run stops at a wall-clock budget and the cosine follows the
    # clock; max_iters only sets the schedule's resolution (warmup = warmup_iters / max_iters of the budget)
    add("time_budget", ["time"], f"--time_budget={budget}", time_budget=budget,
        max_iters=5 * S0, warmup_iters=5 * base["warmup_iters"])
    for B in p["batch_sizes"] + p["extra_batch_sizes"]:
        # equal tokens: steps scale as 1/B; lr by sqrt(B/B0); eval_iters keep the same scored validation tokens
        over = dict(batch_size=B, max_iters=max(1, S0 * B0 // B), warmup_iters=max(1, base["warmup_iters"] * B0 // B),
                    learning_rate=float(f"{lr0 * math.sqrt(B / B0):.2g}"),
                    eval_iters=max(1, p["eval_tokens"] // (B * base["context_length"])),
                    eval_interval=max(1, base["eval_interval"] * B0 // B))
        add(f"batch_{B}", ["batch"], f"batch {B}, lr {over['learning_rate']:g}, {over['max_iters']} steps", **over)
        if B in p["extra_batch_sizes"]:
            runs[-1]["extra"] = True
    # extras (run with --all or --only): is the sqrt(B) lr rule needed at all, and how big is seed noise?
    for B in p["batch_sizes"]:
        r = next(r for r in runs if r["name"] == f"batch_{B}")
        add(f"batch_{B}_lr0", ["batch"], f"batch {B}, lr {lr0:g} (not rescaled), {r['flags']['max_iters']} steps",
            **{**r["flags"], "learning_rate": lr0})
        runs[-1]["extra"] = True
    add("baseline_seed2", ["ablation"], "baseline, another seed (noise level)", seed=1338)
    runs[-1]["extra"] = True
    if p.get("ablation_lr"):
        lr = p["ablation_lr"]
        next(r for r in runs if r["name"] == _lr_name(lr))["groups"].append("ablation_lr")
        for name, change, over in ABLATIONS:
            if over.get("d_ff") == "4x":
                over = {**over, "d_ff": 4 * base["d_model"]}
            add(f"{name}_{_lr_name(lr)}", ["ablation_lr"], f"{change}, lr {lr:g}", learning_rate=lr, **over)
            runs[-1]["extra"] = True
    return runs


def train_args(flags, data_dir, out_dir):
    args = [f"--data_dir={data_dir}", "--prepare_data=false", f"--out_dir={out_dir}", "--fresh",
            "--num_samples=0", "--log_interval=5"]
    return args + [f"--{k}={v}" for k, v in flags.items()]


# ----------------------------------------------------------------------------------------------------------------------
# step 1: data

def _path_tag(path):
    """A folder as a name: its path from the repository root (or its absolute path) with '-' for '/', so that two
    data folders of one name (a/data, b/data) never share a results folder."""
    return str(_rel(Path(path).resolve())).strip("/").replace("/", "-")


def data_dir_of(preset_name, scratch, data_dir=None):
    """Where a preset's runs read their tokens: --data_dir, the preset's own folder, or one made in scratch."""
    named = data_dir or PRESETS[preset_name]["data_dir"]
    return ROOT / named if named else scratch / "data"


def prepare_data(preset_name, scratch, data_dir=None, log=print, texts=None):
    """Tokenizer + train.bin / val.bin for the cpu preset (reused when present); returns the data dir. texts: the
    (training, validation) text files (--train / --valid), else the preset's, else the fetched TinyStories head."""
    import fineweb
    p = PRESETS[preset_name]
    if data_dir or p["data_dir"]:
        d = data_dir_of(preset_name, scratch, data_dir)
        if not any(d.glob("train*.bin")):
            raise SystemExit(f"experiments.py: --data_dir {data_dir}: no train*.bin token files in {d} (fineweb.py "
                             f"writes them)" if data_dir else
                             f"experiments.py: --preset={preset_name}: no train*.bin in {d}; prepare it first "
                             f"(`python train.py --preset=tinystories` prints the commands)")
        return d
    if texts is None and p["train_text"] is None:
        texts = fineweb.tinystories_head(log=log)
    p = dict(p, train_text=Path(texts[0]), val_text=Path(texts[1])) if texts else p
    for path in (p["train_text"], p["val_text"]):
        if not Path(path).is_file():
            raise SystemExit(f"experiments.py: {path}: training/validation text not found")
    data_dir = data_dir_of(preset_name, scratch)
    tok_dir = scratch / f"tokenizer-{p['vocab_size']}"
    # what the tokenizer and tokens were made from: each text's name, size and contents (two heads of one size, or
    # an edit that keeps the size, are other texts)
    made_from = {split: [Path(p[f"{split}_text"]).name, Path(p[f"{split}_text"]).stat().st_size,
                         fineweb.file_sha256(p[f"{split}_text"])] for split in ("train", "val")}
    record = scratch / "made_from.json"
    if record.is_file() and json.loads(record.read_text()) != made_from:   # the preset's texts were edited
        log(f"data: {_rel(scratch)} was made from other texts: training the tokenizer and encoding again")
        shutil.rmtree(tok_dir, ignore_errors=True)
        for split in ("train", "val"):
            Path(data_dir, f"{split}.bin.json").unlink(missing_ok=True)
    if not (tok_dir / "vocab.json").is_file():
        t0 = time.perf_counter()
        vocab, merges = bpe.train_bpe(str(p["train_text"]), p["vocab_size"], [bpe.EOT])
        bpe.Tokenizer(vocab, merges, [bpe.EOT]).save_dir(tok_dir)
        log(f"tokenizer: {p['vocab_size']} ids trained on {p['train_text'].name} in {time.perf_counter() - t0:.1f}s"
            f" -> {_rel(tok_dir)}")
    tok_ref = str(_rel(tok_dir))   # train.py / sample.py run from the repository root
    meta = {}
    for split, text in (("train", p["train_text"]), ("val", p["val_text"])):
        out = data_dir / f"{split}.bin"
        side = Path(str(out) + ".json")
        old = json.loads(side.read_text()) if side.is_file() else {}
        if (old.get("tokenizer"), old.get("tokenizer_fingerprint")) == (tok_ref, bpe.tokenizer_fingerprint(tok_dir)):
            meta[split] = old   # encoded by this very tokenizer: kept
            continue
        meta[split] = bpe.encode_file(str(text), tok_ref, str(out))
        log(f"encoded {text.name}: {meta[split]['num_tokens']:,} tokens -> {_rel(out)}")
    record.write_text(json.dumps(made_from) + "\n")
    write_setup(preset_name, data_dir, tok_ref, meta, p)
    return data_dir


def write_setup(preset_name, data_dir, tok_ref, meta, p):
    """results/setup.json: the data figures the report quotes (sizes, bytes/token, the unigram loss) and the token
    files' stamp (the data whose runs it reports)."""
    import numpy as np
    train = np.fromfile(data_dir / "train.bin", dtype=np.uint16)
    val = np.fromfile(data_dir / "val.bin", dtype=np.uint16)
    # the loss of the best context-free model: train-set token frequencies (add-one smoothed) scored on val
    counts = np.bincount(train, minlength=p["vocab_size"]).astype(np.float64) + 1
    unigram = float(-np.log(counts[val] / counts.sum()).mean())
    setup = dict(preset=preset_name, tokenizer=tok_ref, vocab_size=p["vocab_size"],
                 train_text=p["train_text"].name, val_text=p["val_text"].name,
                 train_bytes=p["train_text"].stat().st_size, val_bytes=p["val_text"].stat().st_size,
                 train_tokens=int(meta["train"]["num_tokens"]), val_tokens=int(meta["val"]["num_tokens"]),
                 train_docs=meta["train"].get("num_docs"), val_docs=meta["val"].get("num_docs"),
                 rare_tokens=int((counts - 1 < 10).sum()), unigram_val_loss=unigram,
                 data=data_stamp(data_dir))   # the report leaves out logs of runs on other data
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "setup.json").write_text(json.dumps(setup, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------------------------
# step 2: the runs

def read_log(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                rows.append(json.loads(line))
                if not isinstance(rows[-1], dict):
                    raise ValueError(f"line {n} is not a JSON object")
    return rows


def finished(summary):
    """Whether a run's log reaches its end: the last evaluation at max_iters (a time-budget run ends earlier)."""
    cfg = summary["cfg"]   # train.py's config record
    return summary["val_loss"] is not None and (bool(cfg.get("time_budget")) or summary["step"] == cfg.get("max_iters"))


def data_stamp(data_dir):
    """What a run's tokens were: each token file's size, vocabulary and tokenizer fingerprint (from its sidecar)."""
    stamp = {}
    for side in sorted(Path(data_dir).glob("*.bin.json")):
        try:
            meta = json.loads(side.read_text())
        except ValueError:
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        binary = side.with_name(side.name[:-len(".json")])
        stamp[binary.name] = [binary.stat().st_size if binary.is_file() else None, meta.get("vocab_size"),
                              meta.get("tokenizer_fingerprint")]
    return stamp


def experiment_record(rows):
    return next((r for r in rows if r.get("type") == "experiment"), None)


def run_one(run, preset_name, data_dir, scratch, rerun=False, log=print):
    """Train one run with train.py (unless results/logs already holds it with the same flags); returns its log."""
    LOGS.mkdir(parents=True, exist_ok=True)
    dest = LOGS / f"{run['name']}.jsonl"
    out_dir = scratch / "runs" / run["name"]
    args = train_args(run["flags"], _rel(data_dir), _rel(out_dir))
    stamp = data_stamp(data_dir)
    if dest.is_file() and not rerun:
        try:
            rows = read_log(dest)
        except ValueError:
            rows = []
        rec = experiment_record(rows)
        if rec and rec.get("args") == args and rec.get("data") == stamp and finished(summarize(rows)):
            log(f"[{run['name']}] done before: {_rel(dest)} (--rerun to train again)")
            return dest
        log(f"[{run['name']}] {_rel(dest)} was made with other flags or data, or is unfinished: training again")
    cmd = [sys.executable, "train.py", *args]
    log(f"[{run['name']}] {shlex.join(cmd[1:])}")
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    last = final = ""
    with open(out_dir / "console.txt", "w") as console:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            console.write(line)
            line = line.rstrip()
            final = line or final
            if line.startswith("step"):   # one tidy progress line per run
                last = line
                sys.stdout.write(f"\r[{run['name']}] {line[:110]:<110}")
                sys.stdout.flush()
        rc = proc.wait()
    wall = time.perf_counter() - t0
    sys.stdout.write("\n")
    if rc != 0:
        raise SystemExit(f"experiments.py: run {run['name']} failed (train.py exit {rc}: {final[:200]}); "
                         f"see {_rel(out_dir / 'console.txt')}")
    rows = read_log(out_dir / "log.jsonl")
    rec = dict(type="experiment", name=run["name"], groups=run["groups"], change=run["change"], preset=preset_name,
               flags=run["flags"], args=args, data=stamp, wall=wall,
               finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "w") as f:   # only the small log travels to results/; the checkpoint stays in scratch
        for r in [rec] + rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, dest)   # all or nothing: a log in results/ is a finished run
    log(f"[{run['name']}] {last.split('|')[1].strip() if '|' in last else ''} | wall {wall:.0f}s -> "
        f"{_rel(dest)}")
    return dest


# ----------------------------------------------------------------------------------------------------------------------
# step 3: samples from the best model

def best_run(runs, require_ckpt_in=None):
    """The finished run with the lowest final validation loss (finite), optionally only those with a checkpoint."""
    best = None
    for run in runs:
        dest = LOGS / f"{run['name']}.jsonl"
        if not dest.is_file():
            continue
        s = summarize(read_log(dest))
        if s["val_loss"] is None or not math.isfinite(s["val_loss"]):
            continue
        if require_ckpt_in is not None and not _ckpt_matches(require_ckpt_in / run["name"] / "ckpt.pt", s):
            continue
        if best is None or s["val_loss"] < best[1]:
            best = (run["name"], s["val_loss"])
    return best


def _ckpt_matches(path, summary):
    """Whether the checkpoint at path is the one the log describes (the same final step and validation loss), not
    one left by another --steps, an interrupted --rerun or other data."""
    if not path.is_file():
        return False
    import torch
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:   # truncated or not a checkpoint: not the one the log describes
        return False
    return isinstance(ckpt, dict) and (ckpt.get("iteration"), ckpt.get("val_loss")) == (summary["step"],
                                                                                         summary["val_loss"])


def write_samples(runs, scratch, num_samples=3, max_new_tokens=200, seed=1337, log=print):
    best = best_run(runs, require_ckpt_in=scratch / "runs")
    if best is None:
        log("samples: no finished run with a checkpoint: skipped")
        return
    name, loss = best
    ckpt = _rel(scratch / "runs" / name / "ckpt.pt")
    cmd = [sys.executable, "sample.py", f"--ckpt={ckpt}", "--temperature=0.8", "--top_p=0.9",
           f"--num_samples={num_samples}", f"--max_new_tokens={max_new_tokens}", f"--seed={seed}",
           "--prompt=Once upon a time", "--device=cpu"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"experiments.py: sample.py failed: {out.stderr.strip().splitlines()[-1:]}")
    head = (f"# samples from the best run, {name} (final val loss {loss:.4f})\n"
            f"# python {shlex.join(cmd[1:])}\n")
    (RESULTS / "samples.txt").write_text(head + out.stdout)
    log(f"samples: {num_samples} from {name} -> {_rel(RESULTS / 'samples.txt')}")


# ----------------------------------------------------------------------------------------------------------------------
# report: tables and plots from results/logs/*.jsonl alone

def summarize(rows):
    rec = experiment_record(rows) or {}
    cfg = next((r for r in rows if r.get("type") == "config"), {})
    train = [r for r in rows if r.get("type") == "train" and all(k in r for k in ("elapsed", "tokens", "loss"))]
    evals = [r for r in rows if r.get("type") == "eval" and "val_loss" in r]
    final = evals[-1] if evals else {}
    tps = sorted(r["tokens_per_sec"] for r in train if r.get("tokens_per_sec"))
    # tokens and training time at the final evaluation's step: a run the clock stopped between two logged steps
    # has trained past its last train record (train.py logs every log_interval steps, and at max_iters)
    per_step = train[-1]["tokens"] / train[-1]["step"] if train and train[-1].get("step") else 0
    return dict(name=rec.get("name"), groups=rec.get("groups", []), change=rec.get("change", ""),
                flags=rec.get("flags", {}), wall=rec.get("wall"), data=rec.get("data"),
                finished=rec.get("finished") or "", cfg=cfg, train=train, evals=evals,
                step=final.get("step"), val_loss=final.get("val_loss"), val_bpb=final.get("val_bpb"),
                train_time=final.get("elapsed", train[-1]["elapsed"] if train else None),
                tokens=round(per_step * final["step"]) if "step" in final else (train[-1]["tokens"] if train else 0),
                tok_s=tps[len(tps) // 2] if tps else None,
                final_train_loss=train[-1]["loss"] if train else None, params=cfg.get("params"))


def _cmd(command, *more):
    """The experiments.py command line for this results folder, as a message quotes it."""
    return shlex.join(["python", "experiments.py", command, *FLAGS, *more])


def _rel(path):
    path = Path(path)
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _fmt(x, spec):
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return "nan"
    return format(x, spec)


GROUPS = [   # (key, title, what varies, the run Δ is measured against: None = "baseline", or a callable of the preset)
    ("lr", "Learning-rate sweep", "batch 32, same steps; peak lr varies (warmup + cosine to 10 %)", None),
    ("batch", "Batch size", "same tokens (steps x batch constant); lr scaled by sqrt(B/32) unless the name ends in "
     "_lr0", None),
    ("ablation", "Ablations", "baseline flags plus one switch each; baseline_seed2 shows the seed-to-seed noise", None),
    ("ablation_lr", "Ablations at the sweep's best learning rate", "the same switches at the best lr of the sweep; "
     "Δ against the baseline at that lr", lambda p: _lr_name(p["ablation_lr"]) if p.get("ablation_lr") else None),
    ("time", "Fixed wall-clock budget", "the time_budget run stops on the clock; the schedule follows the clock", None),
]


def report(preset="cpu", steps=None, log=print):
    """results.md and its plots, grouped and ordered as plan(preset, steps) runs them (the tables alone, with a
    note, when matplotlib is not installed: it is optional, and `run` ends here after all its training)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None

    files = sorted(LOGS.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"experiments.py: no logs in {_rel(LOGS)}; run `{_cmd('run')}` first")
    runs = {}   # run name -> (its log file, its summary)
    for f in files:
        try:
            r = summarize(read_log(f))
        except (ValueError, OSError) as e:   # a truncated or hand-edited log, or not a file
            log(f"experiments.py: report: skipping {_rel(f)}: not a JSON-lines log ({e})")
            continue
        if not r["name"]:
            log(f"experiments.py: report: skipping {_rel(f)}: no experiment record (not written by experiments.py run)")
        elif not r["train"] or not finished(r):
            log(f"experiments.py: report: skipping {_rel(f)}: incomplete run (it does not reach its last step's "
                f"validation loss); rerun it with `{_cmd('run', '--only=' + r['name'], '--rerun')}`")
        else:
            if r["name"] in runs:   # a log copied under another name: reported once, from the file `run` wrote
                other = runs[r["name"]][0]
                keep, drop = (f, other) if f.stem == r["name"] else (other, f)
                log(f"experiments.py: report: skipping {_rel(drop)}: another log of run {r['name']!r} ({_rel(keep)})")
                if keep is other:
                    continue
            runs[r["name"]] = (f, r)
    setup = {}
    if (RESULTS / "setup.json").exists():
        try:
            setup = json.loads((RESULTS / "setup.json").read_text())
        except (ValueError, OSError):
            setup = None
        needed = ("preset", "train_text", "train_bytes", "train_tokens", "val_text", "val_bytes", "val_tokens",
                  "vocab_size", "unigram_val_loss")
        if not isinstance(setup, dict) or not all(k in setup for k in needed) or setup["preset"] not in PRESETS:
            log(f"experiments.py: report: {_rel(RESULTS / 'setup.json')} is unreadable or incomplete: the data "
                f"figures are left out (`{_cmd('run')}` writes it again)")
            setup = {}
    # one report, one data: the data setup.json describes (the last `run`'s), else the latest run's; a log of a run
    # on other tokens (another text, a re-prepared folder) is left out, as its losses do not compare
    latest = max((r for _, r in runs.values()), key=lambda r: r["finished"], default=None)
    data = setup["data"] if "data" in setup else latest and latest["data"]
    other = sorted(name for name, (_, r) in runs.items() if r["data"] != data)
    if other:
        log(f"experiments.py: report: leaving out {', '.join(other)}: trained on other data than "
            f"{_rel(RESULTS / 'setup.json') if 'data' in setup else 'the latest run'}; "
            f"`{_cmd('run', '--only=' + ','.join(other))}` on this data trains them on it")
    runs = [r for name, (_, r) in runs.items() if name not in other]
    by_name = {r["name"]: r for r in runs}
    base = by_name.get("baseline")
    unigram = setup.get("unigram_val_loss")
    planned = plan(preset, steps)
    order = {r["name"]: i for i, r in enumerate(planned)}
    groups = {r["name"]: r["groups"] for r in planned}   # the plan's grouping wins over the one a log recorded

    lines = ["# Experiments", "", f"Generated by `{_cmd('report')}` from `{_rel(LOGS)}/*.jsonl`.", ""]
    if setup:
        lines += [f"Data: `{setup['train_text']}` ({setup['train_bytes']:,} bytes, {setup['train_tokens']:,} tokens) "
                  f"for training, `{setup['val_text']}` ({setup['val_bytes']:,} bytes, {setup['val_tokens']:,} tokens) "
                  f"for validation; bpe.py tokenizer with {setup['vocab_size']:,} ids trained on the training text "
                  f"({setup['train_bytes'] / setup['train_tokens']:.2f} bytes/token). "
                  f"Unigram loss on val (train-set frequencies): {unigram:.3f} nats/token.", ""]
    if base:
        c = base["cfg"]
        mc = c.get("model_config", {})
        tps = c.get("batch_size", 0) * c.get("context_length", 0)
        lines += [f"Baseline: Llama-style, {mc.get('num_layers')} layers, d_model {mc.get('d_model')}, "
                  f"{mc.get('num_heads')} heads, d_ff {mc.get('d_ff')} (SwiGLU), RoPE, "
                  f"context {mc.get('context_length')}, "
                  f"batch {c.get('batch_size')} = {tps:,} tokens/step, {c.get('max_iters')} steps "
                  f"= {tps * c.get('max_iters', 0):,} tokens, lr {c.get('learning_rate'):g} "
                  f"(warmup {c.get('warmup_iters')}, cosine to {c.get('min_lr_ratio'):g}x), "
                  f"AdamW wd {c.get('weight_decay'):g}, clip {c.get('grad_clip'):g}, "
                  f"seed {c.get('seed')}; median {_fmt(base['tok_s'], ',.0f')} tokens/s "
                  f"({c.get('num_threads') or 'default'} torch thread(s)). Validation loss is scored on the same first "
                  f"{c.get('eval_iters', 0) * tps:,} validation tokens in every run.", ""]
    for key, title, what, ref in GROUPS:
        ref = by_name.get(ref(PRESETS[preset]) if ref else "baseline")
        members = sorted((r for r in runs if key in groups.get(r["name"], r["groups"])),
                         key=lambda r: order.get(r["name"], 99))
        if key == "lr":
            members.sort(key=lambda r: r["cfg"].get("learning_rate", 0))
        if key == "batch":
            members.sort(key=lambda r: (r["cfg"].get("batch_size", 0), r["cfg"].get("learning_rate", 0)))
        if not members:
            continue
        ref_name = ref["name"] if ref else "baseline"
        lines += [f"## {title}", "", what + ".", "",
                  (f"| run | change | steps | tokens | val loss | bits/byte | Δ vs {ref_name} | train time | "
                   f"wall time | tokens/s |"),
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in members:
            d = ((r["val_loss"] - ref["val_loss"])
                 if ref and r["val_loss"] is not None and ref["val_loss"] is not None else None)
            lines.append(f"| {r['name']} | {r['change']} | {r['step']} | {r['tokens']:,} | "
                         f"{_fmt(r['val_loss'], '.4f')} | "
                         f"{_fmt(r['val_bpb'], '.4f')} | {_fmt(d, '+.4f') if r['name'] != ref_name else '0'} | "
                         f"{_fmt(r['train_time'], '.0f')} s | {_fmt(r['wall'], '.0f')} s | "
                         f"{_fmt(r['tok_s'], ',.0f')} |")
        png = f"{key}.png"
        if plt is not None:
            plot_group(plt, members, title, unigram, RESULTS / png, lr_panel=(key == "time"))
            lines += ["", f"![{title}]({png})", ""]
        else:
            lines += [""]
    if (RESULTS / "samples.txt").is_file():
        lines += ["## Samples (temperature 0.8, top-p 0.9)", "", "```", (RESULTS / "samples.txt").read_text().rstrip(),
                  "```", ""]
    (RESULTS / "results.md").write_text("\n".join(lines))
    if plt is not None:
        log(f"wrote {_rel(RESULTS / 'results.md')} and its PNGs from {len(runs)} logs")
    else:
        log(f"wrote {_rel(RESULTS / 'results.md')} from {len(runs)} logs, without its plots: matplotlib is not "
            f"installed (pip install matplotlib, then `{_cmd('report')}`)")


def plot_group(plt, members, title, unigram, path, lr_panel=False):
    """Loss vs steps and loss vs training wall clock (train loss lines, validation loss dots); lr_panel adds the
    learning rate against training time (how a --time_budget schedule follows the clock)."""
    fig, axes = plt.subplots(1, 3 if lr_panel else 2, figsize=(18 if lr_panel else 12, 4.5))
    finite = [e["val_loss"] for r in members for e in r["evals"]
              if e["val_loss"] is not None and math.isfinite(e["val_loss"])]
    lo = min(finite) if finite else 0
    for r in members:
        label = f"{r['name']} ({_fmt(r['val_loss'], '.3f')})"
        for ax, xkey in zip(axes, ("step", "elapsed")):
            xs = [t[xkey] for t in r["train"]]
            ys = [t["loss"] for t in r["train"]]
            line, = ax.plot(xs, ys, lw=1.2, alpha=0.85, label=label)
            ev = [e for e in r["evals"] if e["val_loss"] is not None]
            ax.plot([e[xkey] for e in ev], [e["val_loss"] for e in ev], "o", ms=4, color=line.get_color())
    if lr_panel:
        for r in members:
            axes[2].plot([t["elapsed"] for t in r["train"]], [t["lr"] for t in r["train"]], label=r["name"])
        axes[2].set_xlabel("training time (s)")
        axes[2].set_ylabel("learning rate")
        axes[2].grid(alpha=0.3)
        axes[2].legend(fontsize=7)
    for ax, xl in zip(axes, ("optimizer step", "training time (s)")):
        if unigram:
            ax.axhline(unigram, color="gray", ls="--", lw=0.8, label=f"unigram {unigram:.2f}")
        ax.set_xlabel(xl)
        ax.set_ylabel("loss (nats/token): lines train, dots val")
        ax.set_ylim(lo - 0.2, (unigram or lo + 3) + 2.5)   # a divergent run goes off the top
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="Run the sweep/ablation set through train.py and report it.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("command", choices=["run", "report", "list"],
                    help="run the set (then report), report only, or list")
    ap.add_argument("--preset", default="cpu", choices=sorted(PRESETS), help="data, shape and sweep values")
    ap.add_argument("--steps", type=int, default=0,
                    help="baseline steps (0 = the preset's); batch runs keep tokens equal")
    ap.add_argument("--only", default="", help="comma-separated run names (see `list`), run in that order; "
                    "default: every run but the extras")
    ap.add_argument("--all", action="store_true",
                    help="also the extra runs (largest batch, batches at the unscaled lr, "
                    "a second seed, the ablations at the best lr)")
    ap.add_argument("--rerun", action="store_true", help="train again even when results/logs holds the same run")
    ap.add_argument("--scratch", type=os.path.expanduser, default="data/experiments",
                    help="folder for data, checkpoints, consoles (not committed)")
    ap.add_argument("--data_dir", type=os.path.expanduser, default="",
                    help="use this prepared train*.bin/val*.bin folder instead of the "
                    "preset's data (no tokenizer training)")
    ap.add_argument("--train", type=os.path.expanduser, default="", help="the cpu preset's training text instead of "
                    "the TinyStories head (data/tinystories-head/train.txt, fetched once by fineweb.py)")
    ap.add_argument("--valid", type=os.path.expanduser, default="", help="its validation text, with --train")
    ap.add_argument("--no_samples", action="store_true", help="skip the samples from the best model")
    bpe.one_line_errors(ap)
    args = ap.parse_args(argv)
    global RESULTS, LOGS, FLAGS
    if args.steps < 0:
        raise SystemExit(f"experiments.py: --steps {args.steps}: expected a positive number of steps (0: the preset's)")
    if (args.train or args.valid) and (PRESETS[args.preset]["data_dir"] or args.data_dir):
        raise SystemExit(f"experiments.py: --train / --valid: the text of the cpu preset only (--preset={args.preset}"
                         f"{' and --data_dir' if args.data_dir else ''} read a prepared folder)")
    if bool(args.train) != bool(args.valid):
        raise SystemExit(f"experiments.py: --{'valid' if args.train else 'train'}: give --train and --valid together")
    for flag in ("train", "valid"):
        if getattr(args, flag) and not Path(getattr(args, flag)).is_file():
            raise SystemExit(f"experiments.py: --{flag} {getattr(args, flag)}: no such file")

    runs = plan(args.preset, args.steps or None)
    names = {r["name"] for r in runs}
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        if not wanted:
            raise SystemExit(f"experiments.py: --only {args.only!r}: expected run names, e.g. --only=baseline,nope")
        bad = [n for n in wanted if n not in names]
        if bad:
            raise SystemExit(f"experiments.py: --only: unknown run(s) {bad}; known: {sorted(names)}")
        selected = [next(r for r in runs if r["name"] == n) for n in wanted]   # in the order given
    else:
        selected = [r for r in runs if args.all or not r.get("extra")]
    scratch = (ROOT / args.scratch / args.preset).resolve()
    RESULTS = RESULTS_ROOT   # results/ holds the write-up's cpu runs: never mix other data or step counts in
    if args.preset != "cpu" or args.data_dir or args.steps:
        RESULTS = RESULTS_ROOT / (args.preset + (f"-{_path_tag(args.data_dir)}" if args.data_dir else "")
                                  + (f"-{args.steps}steps" if args.steps else ""))
        if args.data_dir or args.steps:
            scratch = scratch.with_name(RESULTS.name)
    LOGS = RESULTS / "logs"
    FLAGS = [f"--preset={args.preset}"] if args.preset != "cpu" else []
    FLAGS += [f"--data_dir={args.data_dir}"] if args.data_dir else []
    FLAGS += [f"--steps={args.steps}"] if args.steps else []

    if args.command == "list":   # the commands `run` gives train.py, from the repository root
        data_dir = _rel(data_dir_of(args.preset, scratch, args.data_dir))
        for r in (selected if args.only else runs):
            print(f"{r['name']:<12} {','.join(r['groups']):<22} {r['change']}{'  (extra)' if r.get('extra') else ''}")
            print(f"    python train.py "
                  f"{shlex.join(train_args(r['flags'], data_dir, _rel(scratch / 'runs' / r['name'])))}")
        return
    try:
        if args.command == "run":
            data_dir = prepare_data(args.preset, scratch, args.data_dir,
                                    texts=(args.train, args.valid) if args.train else None)
            t0 = time.perf_counter()
            for i, r in enumerate(selected):
                print(f"---- run {i + 1}/{len(selected)} ({time.perf_counter() - t0:.0f}s so far)")
                run_one(r, args.preset, data_dir, scratch, rerun=args.rerun)
            if not args.no_samples:
                write_samples(runs, scratch)
        report(args.preset, args.steps or None)
    except OSError as e:   # a --scratch or results folder that is a file, a full disk, ...
        raise SystemExit(f"experiments.py: {e}") from None
    except KeyboardInterrupt:   # train.py got the Ctrl-C too and checkpointed; finished runs are in results/logs
        raise SystemExit(f"\nexperiments.py: interrupted; `{_cmd('run')}` again trains what is missing")


if __name__ == "__main__":
    bpe.run_main(main)
