"""HellaSwag evaluation: can the model tell which of 4 endings continues an everyday scene?

HellaSwag (Zellers et al., 2019) gives a context and 4 candidate endings, one of them true. Each ending is
rendered as context + " " + ending and scored by the cross-entropy of its own tokens only (the context is
shared by the 4 rows, so it carries no signal): the "completion" style of build-nanogpt. The model picks the
ending with the lowest loss, counted three ways, and each compares with other published numbers:
  acc            the summed loss (the ending's total log-likelihood);
  acc_norm       the loss per TOKEN of the ending: build-nanogpt's normalisation, the figure it reports. The released
                 GPT-2 124M scores 0.2955 on the 10,042 validation examples (GPT-3 124M: 0.337);
  acc_norm_char  the summed loss per CHARACTER of the ending (its length without the joining space): the
                 normalisation of EleutherAI's lm-evaluation-harness, the "acc_norm" of its tables.
The two normalisations often pick different endings, so a figure is only comparable with one measured the same
way. lm-eval's own `hellaswag` task also rewrites the text (the activity label in front, WikiHow's [title]
markers removed), so the figure of its tables (0.3114 acc_norm for GPT-2 124M) is what
`python eval.py --init_from=gpt2 --tasks hellaswag_local` prints; acc_norm_char is lm-eval's normalisation of this
file's rendering.

Commands:
  python hellaswag.py --init_from=gpt2                 # released GPT-2 124M (downloads weights + val set)
  python hellaswag.py --ckpt out/ckpt.pt               # a train.py checkpoint, with its own tokenizer
  python hellaswag.py --ckpt out/ckpt.pt --data hellaswag_val.jsonl --limit 100 --verbose
  torchrun --standalone --nproc_per_node=8 hellaswag.py --init_from=gpt2    # examples sharded over ranks

From Python (train.py does this during training, compiled or not):
  from hellaswag import load_examples, evaluate
  examples = load_examples()                     # or load_examples("local/hellaswag_val.jsonl")
  result = evaluate(raw_model, tokenizer, examples, device, ddp_rank, ddp_world_size)
  print(result_line(result))                     # hellaswag acc_norm 0.2955 (2967/10042) acc ... acc_norm_char ...
"""
import argparse
import http.client
import json
import os
import shutil
import sys
import time
import urllib.request
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import bpe
import model as model_lib
from sample import load_model_and_tokenizer

# the original repository's copies (rowanz/hellaswag); only val has labels we can score (test is hidden)
VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
DATA_DIR = Path(__file__).resolve().parent / "data" / "hellaswag"
NUM_ENDINGS = 4

# -----------------------------------------------------------------------------
# data


def download(url, dest):
    """Fetch url to dest once; the write is atomic so an interrupted download never looks complete."""
    dest = Path(dest)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # per-process, so concurrent ranks never collide
    print(f"downloading {url} -> {dest}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
        os.replace(tmp, dest)
    except (OSError, http.client.HTTPException) as e:  # HTTPException: e.g. the connection dropped mid-file
        raise RuntimeError(f"cannot download {url} ({e}); offline? give the path of a local copy") from e
    finally:
        tmp.unlink(missing_ok=True)  # a failed or interrupted (Ctrl-C) download leaves no partial file
    return dest


def parse_example(line, where):
    """One HellaSwag jsonl row -> the row as a dict, checked, with an int label. `where` is 'file:line'."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON object ({e.msg})") from None
    return check_example(row, where)


def check_example(row, where):
    """A HellaSwag row (parsed from the jsonl, or a Hugging Face `datasets` row) -> a copy with an int label, or one
    ValueError starting with `where`. evaluate() checks every example it is given too: a label left a string would
    never equal the pick, and a perfect model would score 0."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with ctx, endings, label")
    ctx, endings, label = row.get("ctx"), row.get("endings"), row.get("label")
    if not isinstance(ctx, str) or not ctx.strip():
        raise ValueError(f"{where}: 'ctx' must be a non-empty string")
    if not (isinstance(endings, list) and len(endings) == NUM_ENDINGS and all(isinstance(e, str) for e in endings)):
        raise ValueError(f"{where}: 'endings' must be a list of {NUM_ENDINGS} strings")
    if isinstance(label, str) and label.strip().isascii() and label.strip().isdigit():  # ("²".isdigit() too)
        label = int(label)  # the Hugging Face copies store labels as strings
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < NUM_ENDINGS:
        raise ValueError(f"{where}: 'label' must be an integer in 0..{NUM_ENDINGS - 1}, got {row.get('label')!r}")
    return dict(row, label=label)


def read_jsonl(path, parse, kind):
    """The rows of a jsonl file, each through parse(line, 'file:line'), blank lines skipped; every problem is one
    ValueError naming the file (kind: what the file should hold, e.g. HellaSwag). lambada.py reads through this too."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: {'a folder' if path.is_dir() else 'no such file'} (expected a {kind} jsonl file)")
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    rows.append(parse(line, f"{path}:{lineno}"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (expected a {kind} jsonl file)") from None
    if not rows:
        raise ValueError(f"{path}: no examples (expected one {kind} JSON object per line)")
    return rows


def load_examples(path=None, data_dir=DATA_DIR):
    """HellaSwag examples from a local jsonl file, or (path=None) the official val set, downloaded and cached."""
    if path is None:
        path = download(VAL_URL, Path(data_dir) / "hellaswag_val.jsonl")
    return read_jsonl(path, parse_example, "HellaSwag")

# -----------------------------------------------------------------------------
# rendering and scoring


class Unscorable(ValueError):
    """An example that cannot be scored by this model: an ending longer than its context, or an empty context."""


def render_example(example, tokenizer, max_len=None):
    """The 4 completions of one example as one padded batch.

    Returns tokens (4, T) and mask (4, T), both int64, and the label. Row i is ctx tokens + tokens of
    " " + ending i (GPT-2 style tokenisers attach the space to the following word), right-padded with 0;
    mask is 1 exactly on the ending tokens, the ones scored. Padding sits after everything scored, and
    attention is causal, so it never changes a scored logit. With max_len (the model's context length) the
    context loses tokens from its start, the same number for all 4 rows so they stay comparable.
    """
    return _render(example, tokenizer, max_len)[:3]


def _render(example, tokenizer, max_len):
    """render_example's (tokens, mask, label) and whether the context was cut to fit max_len."""
    example = check_example(example, f"hellaswag example {example.get('ind') if isinstance(example, dict) else ''}")
    ctx_tokens = tokenizer.encode(example["ctx"])
    num_ctx = len(ctx_tokens)
    end_tokens = [tokenizer.encode(" " + ending) for ending in example["endings"]]
    longest = max(len(t) for t in end_tokens)
    if max_len is not None:
        if longest + 1 > max_len:
            raise Unscorable(f"hellaswag example {example.get('ind')}: an ending has {longest} tokens, "
                             f"too long for context length {max_len}")
        ctx_tokens = ctx_tokens[-(max_len - longest):]
    if not ctx_tokens:
        raise Unscorable(f"hellaswag example {example.get('ind')}: the context encodes to no tokens")
    tokens = torch.zeros(len(end_tokens), len(ctx_tokens) + longest, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, end in enumerate(end_tokens):
        row = ctx_tokens + end
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, len(ctx_tokens):len(row)] = 1
    return tokens, mask, example["label"], len(ctx_tokens) < num_ctx


def score_endings(model, tokens, mask):
    """Per row: summed and average cross-entropy of the tokens where mask is 1 -> (sum_loss, avg_loss), (N,) each."""
    logits = model_lib.logits(model, tokens)[:, :-1]  # position t predicts token t+1
    targets, scored = tokens[:, 1:], mask[:, 1:].bool()
    # cross-entropy (in float32) only where it counts: the ending tokens are a fraction of a padded batch,
    # and with a 50k vocabulary the full (B, T, vocab) float32 copy is the largest tensor in the evaluation
    losses = torch.zeros(targets.shape, device=logits.device)
    losses[scored] = F.cross_entropy(logits[scored].float(), targets[scored], reduction="none")
    sum_loss = losses.sum(dim=1)
    return sum_loss, sum_loss / scored.sum(dim=1)


def evaluate(model, tokenizer, examples, device, ddp_rank=0, ddp_world_size=1, verbose=False,
             batch_examples=4, progress=False):
    """HellaSwag accuracy of model on examples -> dict(acc, acc_norm, acc_norm_char, num_correct, num_correct_norm,
    num_correct_norm_char, num_total, num_skipped), plus num_cut when some contexts lost tokens from their start to
    fit the model's context. acc_norm is per token (build-nanogpt's), acc_norm_char per character (lm-eval's).

    Examples the model cannot score (an ending longer than its context: small-context models during training)
    are skipped and counted in num_skipped rather than stopping the run; accuracy is over the num_total scored.

    Rank r scores examples r, r + world_size, ...; the counts are summed over ranks (every rank gets the
    totals), so all ranks must call this together. batch_examples examples (x4 rows) go through one forward.
    Runs under no_grad in eval mode and restores the previous mode, so it can be called mid-training; pass
    the uncompiled module (wrappers are stripped anyway). Ties go to the lowest ending index.
    """
    model = model_lib.unwrap(model)   # eagerly: the varying shapes would recompile a compiled module, and DDP's
    was_training = model.training    # forward would expect every rank to step in lockstep
    model.eval()
    max_len = getattr(model, "context_length", None)
    mine = range(ddp_rank, len(examples), ddp_world_size)
    num_correct = num_correct_norm = num_correct_char = num_done = num_skipped = num_cut = 0
    bar = bpe.progress_bar(len(mine), "hellaswag", "example", enabled=progress and bool(mine))
    try:
        with torch.no_grad():
            for start in range(0, len(mine), batch_examples):
                batch, rendered = [], []
                for i in mine[start:start + batch_examples]:
                    try:
                        tokens, mask, label, cut = _render(examples[i], tokenizer, max_len)
                    except Unscorable:
                        num_skipped += 1
                        continue
                    rendered.append((tokens, mask, label))
                    batch.append(examples[i])
                    num_cut += cut
                if batch:  # else every example in this batch was skipped
                    T = max(tokens.size(1) for tokens, _, _ in rendered)
                    tokens = torch.cat([F.pad(t, (0, T - t.size(1))) for t, _, _ in rendered]).to(device)
                    mask = torch.cat([F.pad(m, (0, T - m.size(1))) for _, m, _ in rendered]).to(device)
                    sum_loss, avg_loss = score_endings(model, tokens, mask)
                    sum_loss, avg_loss = sum_loss.view(-1, NUM_ENDINGS).cpu(), avg_loss.view(-1, NUM_ENDINGS).cpu()
                    for ex, (_, _, label), sums, avgs in zip(batch, rendered, sum_loss, avg_loss):
                        per_char = sums / torch.tensor([float(len(e)) for e in ex["endings"]])  # as lm-eval counts
                        pred, pred_norm, pred_char = (x.argmin().item() for x in (sums, avgs, per_char))
                        num_correct += pred == label
                        num_correct_norm += pred_norm == label
                        num_correct_char += pred_char == label
                        num_done += 1
                        if verbose:
                            print(f"--- example ind={ex.get('ind')} label={label} acc pick={pred} "
                                  f"acc_norm pick={pred_norm} acc_norm_char pick={pred_char} "
                                  f"(rank {ddp_rank}: acc_norm {num_correct_norm}/{num_done})\n  ctx: {ex['ctx']}")
                            for i, ending in enumerate(ex["endings"]):
                                flag = ("label " if i == label else "      ") + ("norm " if i == pred_norm else "     ")
                                print(f"  {i} {flag}avg {avgs[i].item():7.4f} sum {sums[i].item():8.3f} "
                                      f"per char {per_char[i].item():7.4f}  {ending}")
                bar.set_postfix_str(f"acc_norm {num_correct_norm / max(num_done, 1):.4f}", refresh=False)
                bar.update(len(mine[start:start + batch_examples]))
    finally:
        bar.close()
        model.train(was_training)
    counts = torch.tensor([num_correct, num_correct_norm, num_correct_char, num_done, num_skipped, num_cut],
                          dtype=torch.long, device=device)
    if ddp_world_size > 1:
        dist.all_reduce(counts)
    num_correct, num_correct_norm, num_correct_char, num_total, num_skipped, num_cut = counts.tolist()
    result = dict(acc=num_correct / max(num_total, 1), acc_norm=num_correct_norm / max(num_total, 1),
                  acc_norm_char=num_correct_char / max(num_total, 1), num_correct=num_correct,
                  num_correct_norm=num_correct_norm, num_correct_norm_char=num_correct_char, num_total=num_total,
                  num_skipped=num_skipped)
    if num_cut:
        result["num_cut"] = num_cut
    return result


def result_line(r):
    skipped = r.get("num_skipped", 0)
    return (f"hellaswag acc_norm {r['acc_norm']:.4f} ({r['num_correct_norm']}/{r['num_total']}) "
            f"acc {r['acc']:.4f} ({r['num_correct']}/{r['num_total']}) "
            f"acc_norm_char {r['acc_norm_char']:.4f} ({r['num_correct_norm_char']}/{r['num_total']})"
            + (f", {skipped} skipped (an ending too long for the context, or an empty context)" if skipped else ""))

# -----------------------------------------------------------------------------
# command line


def load_model(args, device, prog="hellaswag.py"):
    """(model, tokenizer) from --ckpt or --init_from (and --tokenizer) through sample.load_model_and_tokenizer; any
    problem -> SystemExit naming prog and the flag."""
    try:
        return load_model_and_tokenizer(args.ckpt, args.init_from, device, args.tokenizer)
    except ValueError as e:
        raise SystemExit(f"{prog}: {e}") from None


def setup_device(device, prog):
    """(device, rank, world_size, ddp) for an evaluation script: --device checked (auto: cuda if available, else
    cpu); under torchrun (RANK / LOCAL_RANK / WORLD_SIZE set) one process group, each rank on its own GPU; TF32
    on CUDA, as the reference figures were measured."""
    ddp = "RANK" in os.environ
    try:
        device = str(model_lib.resolve_device(device))
    except ValueError as e:
        raise SystemExit(f"{prog}: {e}")
    rank, world_size = 0, 1
    if ddp:
        if device.startswith("cuda"):
            try:
                device = str(model_lib.rank_gpu(int(os.environ["LOCAL_RANK"])))
            except ValueError as e:
                raise SystemExit(f"{prog}: {e}")
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    if torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("high")
    return device, rank, world_size, ddp


def eval_main(prog, description, *, data_help, data_dir, item, answer, batch, dtype_help, verbose_help,
              load_examples, evaluate, result_line):
    """The command line of an evaluation script, hellaswag.py's and lambada.py's: the flags and their checks, the
    device (and DDP) set-up, the model, the data, the evaluation and the printed result. The two scripts differ in
    their words (prog, the help texts, `item`: what is scored, `answer`: what follows its context, `batch`: the
    batch flag as (name, default, help)) and in their load_examples, evaluate and result_line."""
    batch_flag, batch_default, batch_help = batch
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ckpt", type=os.path.expanduser, default=None,
                        help="train.py checkpoint to evaluate (either model.py architecture)")
    parser.add_argument("--init_from", type=os.path.expanduser, default=None,
                        help="released weights instead: gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local HF directory")
    parser.add_argument("--tokenizer", type=os.path.expanduser, default=None,
                        help="tokenizer ref overriding the checkpoint's (gpt2 or a bpe.py tokenizer directory)")
    parser.add_argument("--data", type=os.path.expanduser, default=None, help=data_help)
    parser.add_argument("--data_dir", type=os.path.expanduser, default=str(data_dir),
                        help=f"where the downloaded {item}s are cached")
    parser.add_argument("--limit", type=int, default=None, help=f"evaluate only the first N {item}s")
    parser.add_argument(batch_flag, type=int, default=batch_default, help=batch_help)
    parser.add_argument("--device", default="auto",
                        help="auto (cuda if available, else cpu), cpu, cuda, cuda:1 or mps")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help=dtype_help)
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    bpe.one_line_errors(parser)
    args = parser.parse_args()
    batch_size = getattr(args, batch_flag[2:])
    if (args.ckpt is None) == (args.init_from is None):
        raise SystemExit(f"{prog}: give exactly one of --ckpt PATH or --init_from NAME")
    if args.limit is not None and args.limit < 1:
        raise SystemExit(f"{prog}: --limit must be a positive integer, got {args.limit}")
    if batch_size < 1:
        raise SystemExit(f"{prog}: {batch_flag} must be a positive integer, got {batch_size}")

    device, rank, world_size, ddp = setup_device(args.device, prog)
    device_type = torch.device(device).type
    model, tokenizer = load_model(args, device, prog)
    try:
        if ddp and rank != 0:
            dist.barrier()  # rank 0 downloads first, the others then read the cached file
        examples = load_examples(args.data, args.data_dir)
        if ddp and rank == 0:
            dist.barrier()
    except (ValueError, RuntimeError, OSError) as e:   # OSError: a --data_dir that is a file, a full disk, ...
        raise SystemExit(f"{prog}: {'--data ' if args.data else '(no --data) '}{e}")
    except KeyboardInterrupt:
        raise SystemExit(f"\n{prog}: interrupted while reading the data")
    examples = examples[:args.limit]

    autocast = (torch.autocast(device_type, dtype=torch.bfloat16)
                if args.dtype == "bfloat16" and device_type == "cuda" else nullcontext())
    t0 = time.time()
    try:
        with autocast:
            result = evaluate(model, tokenizer, examples, device, rank, world_size, verbose=args.verbose,
                              progress=rank == 0 and not args.verbose,
                              **{batch_flag[2:]: batch_size})   # batch_examples= or batch_size=
    except ValueError as e:
        raise SystemExit(f"{prog}: {e}")
    except KeyboardInterrupt:
        raise SystemExit(f"\n{prog}: interrupted before the last {item}: no score")
    if result["num_total"] == 0:
        raise SystemExit(f"{prog}: no {item} fits the model's context ({model.context_length} tokens): all "
                         f"{result['num_skipped']} skipped ({answer}s too long for it, or empty contexts)")
    if rank == 0:
        if result.get("num_cut"):
            print(f"{prog}: warning: {result['num_cut']} of {result['num_total']} contexts were too long for the "
                  f"model's context ({model.context_length} tokens) with their {answer}s: cut from the start",
                  file=sys.stderr)
        print(f"{result['num_total']} {item}s scored in {time.time() - t0:.1f}s on {world_size} process(es), {device}")
        print(result_line(result))
    if ddp:
        dist.barrier()  # ranks leave together (see train.py)
        dist.destroy_process_group()


def main():
    eval_main("hellaswag.py", "HellaSwag accuracy of a checkpoint or of released GPT-2 weights: acc_norm per token "
              "(build-nanogpt's), acc, acc_norm_char per character (lm-eval's acc_norm).",
              data_help="local HellaSwag jsonl; default: the official val set, downloaded", data_dir=DATA_DIR,
              item="example", answer="ending", batch=("--batch_examples", 4, "examples per forward (4 rows each)"),
              dtype_help="autocast dtype of the forward on cuda (the 0.2955 reference figure is float32)",
              verbose_help="print every example with the 4 ending losses",
              load_examples=load_examples, evaluate=evaluate, result_line=result_line)


if __name__ == "__main__":
    bpe.run_main(main)
