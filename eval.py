"""Evaluate a checkpoint (or GPT-2's weights) with EleutherAI's lm-evaluation-harness: its tasks, its scoring.

    python eval.py --ckpt out/ckpt.pt --tasks hellaswag,lambada_openai,arc_easy,piqa   # the hub's tasks: online
    python eval.py --init_from=gpt2 --tasks hellaswag_local,lambada_openai_local        # offline, once downloaded
    python eval.py --ckpt out/ckpt.pt --tasks hellaswag_local --limit 500 --device cuda --dtype bfloat16
    python eval.py --ckpt out/ckpt.pt --tasks my_task --include_path my_tasks/          # task YAMLs of your own

Needs lm-eval (`pip install -r requirements-eval.txt`). The model is loaded as sample.py loads it (either
architecture, its own tokenizer or a matching --tokenizer) and wrapped in HarnessLM, lm-eval's `LM` interface:
  loglikelihood          (context, continuation) tokenised as lm-eval tokenises for every model (TemplateLM: the
                         context's trailing whitespace moves to the continuation, both are tokenised as one string
                         and split after the context's tokens), then scored --batch_size sequences per forward,
                         longest first: the continuation's summed log-probability, and whether each of its tokens is
                         the argmax; a sequence longer than the context loses its start;
  loglikelihood_rolling  a whole document in windows of the model's context (lm-eval's rolling windows: every token
                         predicted once, the first after <|endoftext|>), for the perplexity tasks;
  generate_until         sample.generate (greedy unless the task asks to sample) until every row of the batch has
                         written a stop string of the task or <|endoftext|>; the text is cut at the first one.
lm_eval.simple_evaluate runs the tasks; the table printed and the JSON written (--output) are lm-eval's.

Local tasks (tasks/ here is always on lm-eval's task path; --include_path adds more):
  hellaswag_local        lm-eval's `hellaswag` (its prompt and preprocessing) on data/hellaswag/hellaswag_val.jsonl,
                         the file `python hellaswag.py` downloads;
  lambada_openai_local   lm-eval's `lambada_openai` on data/lambada/lambada_test.jsonl, the file `python lambada.py`
                         downloads.
Their paths are relative to the working directory: run eval.py from the repository root.
"""
import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

import bpe
import model as model_lib
from sample import generate, load_model_and_tokenizer

try:   # optional (requirements-eval.txt): without it, main() says how to install it
    import lm_eval
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import get_rolling_token_windows, handle_non_serializable, make_disjoint_window, make_table
except ImportError:
    lm_eval, TemplateLM = None, object

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# -----------------------------------------------------------------------------
# the model as lm-eval sees it


class _AllStopped(Exception):
    """Raised from generate()'s on_token once every row of the batch has written a stop string: ends it early."""


class ContextTooShort(ValueError):
    """A request longer than the model's context: lm-eval has no way to skip it, so the evaluation stops."""


class HarnessLM(TemplateLM):
    """lm-eval's LM over a model.py model and a bpe.py tokenizer (or tiktoken's GPT-2)."""

    max_gen_toks = 256   # lm-eval's default for a task that names no max_gen_toks (as its HF backend)

    def __init__(self, model, tokenizer, batch_size=16):
        super().__init__()
        self.model, self.tokenizer, self.batch_size = model_lib.unwrap(model).eval(), tokenizer, batch_size
        self._device = next(self.model.parameters()).device

    @property
    def eot_token_id(self):
        if self.tokenizer.eot_id is None:
            raise ValueError("the tokenizer has no <|endoftext|>, which lm-eval puts before an empty context")
        return self.tokenizer.eot_id

    @property
    def max_length(self):
        return self.model.context_length

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tokenizer.encode(string)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        """(summed log p(continuation | context), continuation all argmax?) per (key, context ids, continuation
        ids), in batches of batch_size sequences sorted longest first (as lm-eval's HF backend: little padding,
        and a batch too big for memory fails at once); the results come back in the requests' order."""
        from tqdm import tqdm
        L = self.max_length
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        results = [None] * len(requests)
        for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm, desc="loglikelihood"):
            batch = order[start:start + self.batch_size]
            seqs = [(requests[i][1] + requests[i][2])[-(L + 1):] for i in batch]   # the input: all but the last
            tokens = torch.zeros(len(batch), max(len(s) for s in seqs) - 1, dtype=torch.long)
            for row, s in enumerate(seqs):
                tokens[row, :len(s) - 1] = torch.tensor(s[:-1])   # right-padded: causal, so padding changes nothing
            logits = model_lib.logits(self.model, tokens.to(self._device))
            for row, (i, s) in enumerate(zip(batch, seqs)):
                cont = requests[i][2]
                if len(cont) > L:
                    raise ContextTooShort(f"a continuation of {len(cont)} tokens is longer than the model's context "
                                          f"({L}): this task needs a model of a longer context (hellaswag.py and "
                                          f"lambada.py skip such examples instead)")
                end = len(s) - 1
                logp = F.log_softmax(logits[row, end - len(cont):end].float(), dim=-1)   # the continuation's rows
                target = torch.tensor(cont, dtype=torch.long, device=logp.device)
                results[i] = (logp.gather(-1, target[:, None]).sum().item(), bool((logp.argmax(-1) == target).all()))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The log-likelihood of each whole document, in lm-eval's rolling windows of the model's context."""
        windows, owner = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            for context, cont in map(make_disjoint_window, get_rolling_token_windows(
                    self.tok_encode(text), self.prefix_token_id, self.max_length, context_len=1)):
                windows.append((None, context, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[i] += logp
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        """Continuations through sample.generate, batched among requests with the same generation settings,
        longest prompt first. The prompt keeps its last context - max_gen_toks tokens (as lm-eval's HF backend),
        but at least half a context: generate() slides its window past the end, so a small model still sees it."""
        eos = None if self.tokenizer.eot_id is None else self.tokenizer.decode([self.tokenizer.eot_id])
        groups = {}
        for i, r in enumerate(requests):
            groups.setdefault(repr(sorted(r.args[1].items())), []).append(i)
        out = [None] * len(requests)
        for idx in groups.values():
            kwargs = normalize_gen_kwargs(requests[idx[0]].args[1], self.max_gen_toks)
            until = [s for s in handle_stop_sequences(kwargs.pop("until", None), eos) if s]
            max_new = kwargs.pop("max_gen_toks")
            temperature = kwargs.get("temperature", 1.0) if kwargs.get("do_sample") else 0.0
            keep = max(self.max_length - max_new, self.max_length // 2)
            prompts = {i: (self.tok_encode(requests[i].args[0]) or [self.eot_token_id])[-keep:] for i in idx}
            idx = sorted(idx, key=lambda i: -len(prompts[i]))
            for start in range(0, len(idx), self.batch_size):
                batch = idx[start:start + self.batch_size]
                texts = self._generate([prompts[i] for i in batch], max_new, until, temperature,
                                       kwargs.get("top_k"), kwargs.get("top_p"))
                for i, text in zip(batch, texts):
                    out[i] = text
        return out

    def _generate(self, prompts, max_new_tokens, until, temperature, top_k, top_p):
        new = [[] for _ in prompts]
        stopped = [False] * len(prompts)

        def on_token(row, token):
            if stopped[row]:
                return
            new[row].append(token)
            stopped[row] = any(s in self.tokenizer.decode(new[row]) for s in until)
            if all(stopped):
                raise _AllStopped

        try:   # no stop_token: <|endoftext|> is one of the stop strings, so every row stops the same way
            generate(self.model, prompts, max_new_tokens, temperature, top_k, top_p, on_token=on_token)
        except _AllStopped:
            pass
        return [postprocess_generated_text(self.tokenizer.decode(ids), until, None) for ids in new]


def task_manager(tasks, include_path=()):
    """lm-eval's TaskManager with tasks/ and include_path on its path. Indexing lm-eval's own ~15,000 task YAMLs
    takes 10-40 s on a CPU, so they are left out when every task asked for is a local one."""
    paths = [str(TASKS_DIR), *map(str, include_path)]
    local = TaskManager(include_path=paths, include_defaults=False)
    return local if set(tasks) <= set(local.all_tasks) else TaskManager(include_path=paths)


def evaluate(lm, tasks, num_fewshot=None, limit=None, include_path=(), bootstrap_iters=100000, log_samples=False,
             model_args=None):
    """lm_eval.simple_evaluate of lm on tasks (names or globs), with tasks/ and include_path on the task path ->
    lm-eval's results dict (with the per-example "samples" when log_samples)."""
    manager = task_manager(tasks, include_path)
    return lm_eval.simple_evaluate(model=lm, model_args=model_args, tasks=list(tasks), num_fewshot=num_fewshot,
                                   limit=limit, task_manager=manager, bootstrap_iters=bootstrap_iters,
                                   log_samples=log_samples)

def offline_mode():
    """Tell huggingface_hub and datasets the hub is unreachable (as HF_HUB_OFFLINE=1 would, read at their import):
    a task's cached data is used, a task without it fails at once."""
    import datasets
    import huggingface_hub
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True


# -----------------------------------------------------------------------------
# command line


def main():
    parser = argparse.ArgumentParser(description="Evaluate a checkpoint or GPT-2 weights on lm-evaluation-harness "
                                     "tasks.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ckpt", type=os.path.expanduser, default=None,
                        help="checkpoint written by train.py (out/ckpt.pt when neither --ckpt nor --init_from is "
                             "given)")
    parser.add_argument("--init_from", type=os.path.expanduser, default=None,
                        help="released weights instead: gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local HF directory")
    parser.add_argument("--tokenizer", type=os.path.expanduser, default=None,
                        help="instead of the checkpoint's tokenizer: gpt2 or a bpe.py tokenizer folder (it must "
                             "be the one the model was trained with)")
    parser.add_argument("--tasks", required=True,
                        help="comma-separated lm-eval task or group names (globs work), e.g. hellaswag,"
                             "lambada_openai,arc_easy,piqa, or the offline hellaswag_local,lambada_openai_local")
    parser.add_argument("--num_fewshot", type=int, default=None, help="examples in each prompt (None: the task's own)")
    parser.add_argument("--limit", type=float, default=None,
                        help="only the first N examples of each task (below 1: that fraction of them)")
    parser.add_argument("--batch_size", type=int, default=16, help="sequences per forward")
    parser.add_argument("--device", default="auto",
                        help="auto (cuda if available, else cpu), cpu, cuda, cuda:1 or mps")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weights dtype")
    parser.add_argument("--include_path", action="append", default=[], type=os.path.expanduser,
                        help="a folder of task YAMLs to add to lm-eval's (repeatable; tasks/ is always there)")
    parser.add_argument("--bootstrap_iters", type=int, default=100000,
                        help="lm-eval's bootstrap resamples for the stderr of non-mean metrics (0 = none: faster)")
    parser.add_argument("--output", type=os.path.expanduser, default=None,
                        help="results JSON to write (default: beside the checkpoint, CKPT_lm_eval.json; for "
                             "--init_from NAME, out/lm_eval_NAME.json)")
    bpe.one_line_errors(parser)
    args = parser.parse_args()

    if lm_eval is None:
        raise SystemExit("eval.py: lm-eval is not installed: pip install -r requirements-eval.txt")
    if args.ckpt and args.init_from:
        raise SystemExit("eval.py: give one of --ckpt PATH or --init_from NAME, not both")
    args.ckpt = args.ckpt or (None if args.init_from else os.path.join("out", "ckpt.pt"))
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise SystemExit("eval.py: --tasks is empty: name at least one lm-eval task")
    if args.limit is not None and not args.limit > 0:
        raise SystemExit(f"eval.py: --limit must be > 0, got {args.limit}")
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    for flag in ("num_fewshot", "bootstrap_iters"):
        if getattr(args, flag) is not None and getattr(args, flag) < 0:
            raise SystemExit(f"eval.py: --{flag} must be >= 0, got {getattr(args, flag)}")
    if args.batch_size < 1:
        raise SystemExit(f"eval.py: --batch_size must be >= 1, got {args.batch_size}")
    for folder in args.include_path:
        if not os.path.isdir(folder):
            raise SystemExit(f"eval.py: --include_path {folder}: no such folder")
    output = Path(args.output or (Path(args.ckpt).with_name(Path(args.ckpt).stem + "_lm_eval.json") if args.ckpt
                                  else Path("out") / f"lm_eval_{Path(args.init_from).name}.json"))
    try:   # before the evaluation, not after it
        bpe.check_output_path(output, "--output")
    except ValueError as e:
        raise SystemExit(f"eval.py: {e}") from None

    try:
        device = str(model_lib.resolve_device(args.device))   # auto -> cuda or cpu
        model, tokenizer = load_model_and_tokenizer(args.ckpt, args.init_from, device, args.tokenizer)
    except ValueError as e:
        raise SystemExit(f"eval.py: {e}") from None
    model.to(dtype=DTYPES[args.dtype])
    lm = HarnessLM(model, tokenizer, args.batch_size)
    source = dict(ckpt=args.ckpt) if args.ckpt else dict(init_from=args.init_from)
    online, why_offline = model_lib.hub_reachable()
    if not online:   # the hub's tasks read their cached copy, or fail at once: no minute of retries per file
        offline_mode()
    try:
        results = evaluate(lm, tasks, args.num_fewshot, limit, args.include_path, args.bootstrap_iters,
                           model_args=dict(source, tokenizer=getattr(tokenizer, "name", None), dtype=args.dtype))
    except KeyError as e:   # lm-eval's word for a task it does not know
        raise SystemExit(f"eval.py: --tasks: {(e.args or [''])[0]}") from None
    except (ValueError, FileNotFoundError, ConnectionError) as e:   # a task's data missing, offline, a bad YAML
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = (" (the local tasks read the files hellaswag.py and lambada.py download: run those once, and eval.py "
                "from the repository root)" if isinstance(e, FileNotFoundError) else
                f" (the Hugging Face hub is unreachable: {why_offline}; offline, the tasks hellaswag_local and "
                f"lambada_openai_local read the files hellaswag.py and lambada.py download)"
                if not online and not isinstance(e, ContextTooShort) else "")
        raise SystemExit(f"eval.py: --tasks {args.tasks}: {first}{hint}") from None
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    results.pop("samples", None)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
                          + "\n", encoding="utf-8")
    except OSError as e:   # a full disk
        raise SystemExit(f"eval.py: --output {output}: could not write it ({bpe.write_error(e)}); the tables above "
                         f"are the results") from None
    print(f"results: {output}")


if __name__ == "__main__":
    bpe.run_main(main)
