"""LAMBADA evaluation: can the model predict the last word of a passage when that needs the whole passage?

LAMBADA (Paperno et al., 2016) holds passages from novels whose last word people guess easily with the
whole passage and hardly at all from the last sentence alone, so it tests long-range context where
HellaSwag tests everyday common sense. This is the version OpenAI used for GPT-2: 5,153 test passages, one
JSON object {"text": ...} per line. Scored, over the target's tokens given the context:
  acc  the fraction of passages whose target tokens are ALL the model's greedy (argmax) choices;
  ppl  exp of the mean, over passages, of the target's summed negative log-likelihood (per-word perplexity).
This is exactly the EleutherAI harness's `lambada_openai` task (lm-eval 0.4.13), where the released GPT-2 124M
is reported at about 0.33 accuracy and perplexity about 40, down to how it splits and tokenises a passage:
  1. the passage is split at its LAST space: the context is everything before it, the target " " + the last word
     (the task's text.split(' ')[:-1] joined by ' ', and ' ' + text.split(' ')[-1]);
  2. whitespace that ends the context moves to the front of the target (the harness's _encode_pair);
  3. context + target is tokenised as ONE string, and the target's tokens are those after the context's own
     tokens (the context tokenised alone).
So "he said  hello" (two spaces) is scored as "  hello" after "he said": with GPT-2's tokenizer the target is
the tokens " " and " hello", both predicted. The GPT-2 paper's own 45.99% / 35.13 used other preprocessing and
is not what this computes.

Commands:
  python lambada.py --init_from=gpt2                   # released GPT-2 124M (downloads weights + test set)
  python lambada.py --ckpt out/ckpt.pt --data lambada_test.jsonl --limit 200 --verbose
  torchrun --standalone --nproc_per_node=8 lambada.py --init_from=gpt2      # passages sharded over ranks

From Python (train.py does this during training with --lambada=true):
  from lambada import load_examples, evaluate, result_line
  result = evaluate(raw_model, tokenizer, load_examples(), device, ddp_rank, ddp_world_size)
  print(result_line(result))                     # lambada acc 0.xxxx (N/5153) ppl P
"""
import json
import math
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import bpe
import model as model_lib
from hellaswag import Unscorable, download, eval_main, read_jsonl

# OpenAI's copy (the one the harness's lambada_openai task was built from)
TEST_URL = "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"
DATA_DIR = Path(__file__).resolve().parent / "data" / "lambada"

# -----------------------------------------------------------------------------
# data


def split_passage(text):
    """A passage -> (context, target) as lm-eval's lambada_openai task writes them: everything before the last
    space, and " " + the last word."""
    context, word = text.rsplit(" ", 1)
    return context, " " + word


def parse_example(line, where):
    """One LAMBADA jsonl row -> {"text": ...}, checked. `where` is 'file:line'."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON object ({e.msg})") from None
    text = row.get("text") if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise ValueError(f'{where}: expected a JSON object with a "text" string')
    if " " not in text.strip() or not all(part.strip() for part in text.rsplit(" ", 1)):
        raise ValueError(f"{where}: 'text' must be a passage of several words ending in the word to predict")
    return row


def load_examples(path=None, data_dir=DATA_DIR):
    """LAMBADA passages from a local jsonl file, or (path=None) OpenAI's test set, downloaded and cached."""
    if path is None:
        path = download(TEST_URL, Path(data_dir) / "lambada_test.jsonl")
    return read_jsonl(path, parse_example, "LAMBADA")

# -----------------------------------------------------------------------------
# rendering and scoring


def render_example(example, tokenizer, max_len=None):
    """(tokens, num_target, cut): context tokens + target tokens as one list, how many at the end are the
    target, and whether the context lost tokens from its start so that the model's input (all tokens but the
    last) fits max_len, the model's context length. Tokenised as lm-eval does (see the docstring at the top)."""
    context, target = split_passage(example["text"])
    stripped = context.rstrip()
    context, target = stripped, context[len(stripped):] + target
    ctx_tokens = tokenizer.encode(context)
    if not ctx_tokens:
        raise Unscorable("lambada: the context encodes to no tokens")
    tgt_tokens = tokenizer.encode(context + target)[len(ctx_tokens):]
    num_ctx = len(ctx_tokens)
    if not tgt_tokens:
        raise Unscorable(f"lambada: the target {target!r} encodes to no tokens")
    if max_len is not None:
        if len(tgt_tokens) > max_len:
            raise Unscorable(f"lambada: the target {target!r} has {len(tgt_tokens)} tokens, too long for context "
                             f"length {max_len}")
        # at least one context token stays: the model's input is max_len tokens, the target at most max_len
        ctx_tokens = ctx_tokens[max(0, len(ctx_tokens) + len(tgt_tokens) - 1 - max_len):]
    return ctx_tokens + tgt_tokens, len(tgt_tokens), len(ctx_tokens) < num_ctx


def score_targets(model, tokens, mask):
    """Per row of a right-padded batch: the summed negative log-likelihood of the tokens where mask is 1, and
    whether every one of them is the model's argmax -> (nll (N,), greedy (N,) bool)."""
    logits = model_lib.logits(model, tokens[:, :-1])  # position t predicts token t+1; the last token is no input
    targets, scored = tokens[:, 1:], mask[:, 1:].bool()
    picked = logits[scored].float()  # only the target positions: a 50k vocabulary makes full logits costly
    nll = torch.zeros(targets.shape, device=logits.device)
    nll[scored] = F.cross_entropy(picked, targets[scored], reduction="none")
    hit = torch.ones(targets.shape, dtype=torch.bool, device=logits.device)
    hit[scored] = picked.argmax(-1) == targets[scored]  # ties go to the lowest id, as in argmax
    return nll.sum(dim=1), hit.all(dim=1)


def evaluate(model, tokenizer, examples, device, ddp_rank=0, ddp_world_size=1, verbose=False, batch_size=8,
             progress=False):
    """LAMBADA accuracy and perplexity of model on examples -> dict(acc, ppl, num_correct, num_total, num_skipped,
    nll), plus num_cut when some contexts lost tokens from their start to fit the model's context.

    Passages the model cannot score (a target longer than its context, a target that encodes to no tokens, an
    empty context) are skipped and counted, not fatal.
    Rank r scores passages r, r + world_size, ...; the sums are all-reduced, so all ranks must call this
    together and all get the totals. batch_size passages go through one padded forward. Runs under no_grad
    in eval mode and restores the previous mode, so it can be called mid-training (wrappers are stripped).
    """
    model = model_lib.unwrap(model)
    was_training = model.training
    model.eval()
    max_len = getattr(model, "context_length", None)
    mine = range(ddp_rank, len(examples), ddp_world_size)
    num_correct = num_done = num_skipped = num_cut = 0
    nll_total = 0.0
    bar = bpe.progress_bar(len(mine), "lambada", "passage", enabled=progress and bool(mine))
    try:
        with torch.no_grad():
            for start in range(0, len(mine), batch_size):
                rendered = []
                for i in mine[start:start + batch_size]:
                    try:
                        ids, num_target, cut = render_example(examples[i], tokenizer, max_len)
                    except Unscorable:
                        num_skipped += 1
                        continue
                    rendered.append((examples[i], ids, num_target))
                    num_cut += cut
                if rendered:  # else every example in this batch was skipped
                    T = max(len(ids) for _, ids, _ in rendered)
                    tokens = torch.zeros(len(rendered), T, dtype=torch.long)
                    mask = torch.zeros_like(tokens)
                    for row, (_, ids, num_target) in enumerate(rendered):
                        tokens[row, :len(ids)] = torch.tensor(ids)
                        mask[row, len(ids) - num_target:len(ids)] = 1
                    nll, greedy = score_targets(model, tokens.to(device), mask.to(device))
                    nll, greedy = nll.cpu().tolist(), greedy.cpu().tolist()
                    for (ex, _, _), loss, hit in zip(rendered, nll, greedy):
                        num_correct += hit
                        num_done += 1
                        nll_total += loss
                        if verbose:
                            context, target = split_passage(ex["text"])
                            tail = context if len(context) <= 120 else "..." + context[-120:]
                            print(f"--- {'right' if hit else 'wrong'} target {target.strip()!r} nll {loss:.3f} "
                                  f"(rank {ddp_rank}: acc {num_correct}/{num_done})\n  {tail}")
                bar.set_postfix_str(f"acc {num_correct / max(num_done, 1):.4f}", refresh=False)
                bar.update(len(mine[start:start + batch_size]))
    finally:
        bar.close()
        model.train(was_training)
    # float64 sums: the counts stay exact (below 2**53) and the log-likelihoods keep their precision
    sums = torch.tensor([num_correct, num_done, num_skipped, num_cut, nll_total], dtype=torch.float64)
    if ddp_world_size > 1:
        sums = sums.to(device)  # NCCL reduces GPU tensors (and MPS, which has no float64, never runs DDP)
        dist.all_reduce(sums)
    num_correct, num_total, num_skipped, num_cut = (int(x) for x in sums[:4].tolist())
    nll_total = sums[4].item()
    result = dict(acc=num_correct / max(num_total, 1),
                  ppl=math.exp(min(nll_total / num_total, 700.0)) if num_total else float("nan"),  # no overflow
                  num_correct=num_correct, num_total=num_total, num_skipped=num_skipped, nll=nll_total)
    if num_cut:
        result["num_cut"] = num_cut
    return result


def result_line(r):
    skipped = r.get("num_skipped", 0)
    return (f"lambada acc {r['acc']:.4f} ({r['num_correct']}/{r['num_total']}) ppl {r['ppl']:.2f}"
            + (f", {skipped} skipped (a target too long for the context, or an empty context)" if skipped else ""))

# -----------------------------------------------------------------------------
# command line


def main():
    eval_main("lambada.py", "LAMBADA last-word accuracy and perplexity of a checkpoint or of released GPT-2 weights.",
              data_help="local LAMBADA jsonl; default: OpenAI's test set, downloaded", data_dir=DATA_DIR,
              item="passage", answer="target", batch=("--batch_size", 8, "passages per forward"),
              dtype_help="autocast dtype of the forward on cuda",
              verbose_help="print every passage's target, loss and verdict",
              load_examples=load_examples, evaluate=evaluate, result_line=result_line)


if __name__ == "__main__":
    bpe.run_main(main)
