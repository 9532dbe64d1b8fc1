"""Export a train.py checkpoint as a Hugging Face folder that transformers loads with no custom code.

    python export.py --ckpt out/ckpt.pt --out out/hf
    python export.py --ckpt out/gpt2-124m/ckpt.pt --out out/hf-124m --dtype bfloat16 --push_to_hub me/gpt2-fineweb
    python -c "from transformers import pipeline; print(pipeline('text-generation', 'out/hf')('Once upon a time'))"

The folder holds config.json, model.safetensors (written with the safetensors library), and the tokenizer as
tokenizer.json + tokenizer_config.json (with vocab.json / merges.txt, GPT-2's file format, beside them), so
`AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained(folder)` load it, and so does
lm-evaluation-harness's `--model hf`.

* GPT-2 checkpoints become GPT2LMHeadModel: the parameter names are already Hugging Face's; the four Conv1D
  weights are transposed (Hugging Face stores them (in, out)); rows added by vocabulary padding are dropped.
* Llama-style checkpoints become LlamaForCausalLM: names mapped (w1/w3/w2 -> gate/up/down_proj), the head tied
  or not as it was trained (tie_embeddings), RMSNorm's eps and the RoPE theta carried. model.py rotates adjacent
  pairs (x0, x1), (x2, x3), ... while Hugging Face rotates the two halves of each head (x_i with x_{i + d/2}), so
  the rows of q_proj and k_proj are permuted within each head (rows 0, 2, 4, ... first, then 1, 3, 5, ...): the
  rotated q.k products, and so the logits, are unchanged.
* Each field of model.py's config dataclass is carried into config.json (CARRIED: the shape, the RoPE theta, the
  tied head), changes how the model computes and not what (attn_impl, GPT-2's vocabulary padding), or must be at
  its default: a checkpoint with another value (an ablation switch, a field added to model.py and not taught here)
  is refused, naming the field and its value, rather than exported as a model that loads and computes otherwise.
* The tokenizer is a byte-level BPE in Hugging Face `tokenizers` form: bpe.py's pre-tokenizer regex, its merges,
  its special tokens, and a pre-token that is itself a token taken whole, as bpe.py does (ignore_merges), so
  AutoTokenizer gives exactly bpe.py's ids. A run on GPT-2's tokenizer gets GPT-2's own vocab.json / merges.txt
  (tiktoken's copies: its cache works offline).

The checkpoint is loaded as sample.py loads it (a --tokenizer must match it: same size, same fingerprint).
--push_to_hub REPO uploads the folder with huggingface_hub (log in first: `hf auth login`).
"""
import argparse
import json
import os
import shutil
import tempfile
from dataclasses import MISSING, fields
from pathlib import Path

import torch

import bpe
import model as model_lib
from sample import load_model_and_tokenizer

# GPT-2's tokenizer files as tiktoken fetches (and caches) them
GPT2_FILES = {"vocab.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
              "merges.txt": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# -----------------------------------------------------------------------------
# weights and config.json

# What each architecture's Hugging Face class is told, field by field of model.py's config dataclass: the fields
# config.json carries (ours -> theirs, written by gpt2_weights / llama_weights) and those that change how the model
# computes, not what. Any other field exports only at its default, the model the class is; so a field added to
# model.py tomorrow is refused, naming it and its value, until it is taught here.
TARGETS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
CARRIED = {
    "gpt2": {"vocab_size": "vocab_size", "block_size": "n_positions", "n_embd": "n_embd", "n_layer": "n_layer",
             "n_head": "n_head"},
    "llama": {"vocab_size": "vocab_size", "context_length": "max_position_embeddings", "d_model": "hidden_size",
              "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "d_ff": "intermediate_size",
              "rope_theta": "rope_theta", "tie_embeddings": "tie_word_embeddings"},
}
HOW_NOT_WHAT = {"gpt2": {"attn_impl", "pad_vocab_to_multiple_of"},   # the padded rows are dropped
                "llama": {"attn_impl"}}
WHY = {"remove_rope": "always applies RoPE", "use_post_norm": "has pre-norm blocks",
       "remove_rmsnorm": "always has its RMSNorms", "ffn_type": "has the gated SwiGLU MLP",
       "qk_norm": "has no query/key norms", "logit_softcap": "does not cap its logits"}


def carried(arch, config):
    """config.json's entries for the fields CARRIED, under Hugging Face's names."""
    return {theirs: getattr(config, ours) for ours, theirs in CARRIED[arch].items()}


def _default(f):
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def refusals(arch, config):
    """The fields of config (a model.py config dataclass) whose value the architecture's Hugging Face class cannot
    express, one phrase each naming the field and its value: every field neither carried nor at its default."""
    known = set(CARRIED[arch]) | HOW_NOT_WHAT[arch]
    out = []
    for f in fields(config):
        value, default = getattr(config, f.name), _default(f)
        if f.name not in known and value != default:
            why = (f"{TARGETS[arch]} {WHY[f.name]}" if f.name in WHY else
                   f"a field export.py does not translate: only its default, {default!r}, exports")
            out.append(f"{f.name}={value!r} ({why})")
    return out


def gpt2_weights(model):
    """(config.json dict, tensors) of a model.GPT as GPT2LMHeadModel."""
    c, V = model.config, model.vocab_size
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    tensors = {}
    for key, w in model.state_dict().items():
        if key == "lm_head.weight":
            continue   # tied to wte: Hugging Face ties it again on load (tie_word_embeddings)
        tensors[key] = w.t() if key.endswith(conv1d) else w[:V] if key == "transformer.wte.weight" else w
    config = dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", **carried("gpt2", c), n_inner=None,
                  activation_function="gelu_new", layer_norm_epsilon=model.transformer.ln_f.eps,
                  tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)   # trained without dropout
    return config, tensors


def rope_halves(w, num_heads):
    """Rows of q_proj / k_proj (d_model, d_model) from adjacent-pair RoPE to half-split RoPE, per head: row 2i
    goes to i and row 2i + 1 to i + d_k/2, as Hugging Face's convert_llama_weights_to_hf permutes Meta's."""
    return w.view(num_heads, -1, 2, w.size(1)).transpose(1, 2).reshape(w.shape)


def llama_weights(model):
    """(config.json dict, tensors) of a model.TransformerLM as LlamaForCausalLM."""
    c = model.config
    sd = model.state_dict()
    tensors = {"model.embed_tokens.weight": sd["token_embeddings.weight"], "model.norm.weight": sd["ln_final.weight"]}
    if not c.tie_embeddings:   # tied: Hugging Face ties lm_head to embed_tokens again on load
        tensors["lm_head.weight"] = sd["lm_head.weight"]
    names = {"ln1.weight": "input_layernorm.weight", "ln2.weight": "post_attention_layernorm.weight",
             "attn.q_proj.weight": "self_attn.q_proj.weight", "attn.k_proj.weight": "self_attn.k_proj.weight",
             "attn.v_proj.weight": "self_attn.v_proj.weight", "attn.output_proj.weight": "self_attn.o_proj.weight",
             "ffn.w1.weight": "mlp.gate_proj.weight", "ffn.w3.weight": "mlp.up_proj.weight",
             "ffn.w2.weight": "mlp.down_proj.weight"}
    rotated = ("attn.q_proj.weight", "attn.k_proj.weight")
    for i in range(c.num_layers):
        for ours, theirs in names.items():
            w = sd[f"layers.{i}.{ours}"]
            tensors[f"model.layers.{i}.{theirs}"] = rope_halves(w, c.num_heads) if ours in rotated else w
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", **carried("llama", c),
                  num_key_value_heads=c.num_heads, head_dim=c.d_model // c.num_heads, rms_norm_eps=model.ln_final.eps,
                  hidden_act="silu", attention_bias=False, mlp_bias=False)
    return config, tensors


# -----------------------------------------------------------------------------
# tokenizer files


def write_gpt2_format(tokenizer, out):
    """vocab.json / merges.txt: GPT-2's own files for the "gpt2" tokenizer, bpe.py's save() for its own."""
    if isinstance(tokenizer, bpe.Tokenizer):
        tokenizer.save(out / "vocab.json", out / "merges.txt")
        return
    from tiktoken.load import read_file_cached
    for name, url in GPT2_FILES.items():
        try:
            data = read_file_cached(url)
        except Exception as e:   # offline with no cached copy: requests' errors run to many lines
            raise ValueError(f"GPT-2's tokenizer file {url} is neither in tiktoken's cache (TIKTOKEN_CACHE_DIR) nor "
                             f"downloadable ({type(e).__name__})") from None
        (out / name).write_bytes(data)


def tokenizer_json(vocab, merges, special_tokens):
    """Hugging Face tokenizers' byte-level BPE encoding exactly as bpe.Tokenizer does (vocab / merges: GPT-2 format)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
        "added_tokens": [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in special_tokens],
        # bpe.py's own pattern (not ByteLevel's built-in copy of GPT-2's), then bytes to GPT-2's printable characters
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": bpe.GPT2_SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True,   # a pre-token that is a token is that token (bpe.py and tiktoken agree)
                  "vocab": vocab, "merges": merges},
    }


def write_tokenizer(tokenizer, out, context_length):
    """tokenizer.json and tokenizer_config.json (plus vocab.json / merges.txt) into the folder out."""
    write_gpt2_format(tokenizer, out)
    with open(out / "vocab.json", encoding="utf-8") as f:
        vocab = json.load(f)
    with open(out / "merges.txt", encoding="utf-8") as f:
        merges = [line.rstrip("\r\n") for n, line in enumerate(f) if line.strip() and not
                  (n == 0 and line.startswith("#version"))]
    with open(out / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges, tokenizer.special_tokens), f, ensure_ascii=False)
    eot = {"bos_token": bpe.EOT, "eos_token": bpe.EOT} if tokenizer.eot_id is not None else {}
    config = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=context_length, add_bos_token=False,
                  add_eos_token=False, clean_up_tokenization_spaces=False, **eot)   # decode gives bpe.py's text
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


# -----------------------------------------------------------------------------
# the folder


def export(model, tokenizer, out, dtype=torch.float32):
    """Write model (a model.GPT or model.TransformerLM) and its tokenizer as a Hugging Face folder `out`
    (created; the files it writes are replaced). Returns the folder as a Path; ValueError for what HF cannot load."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file
    model = model_lib.unwrap(model)
    arch = model.model_config()["arch"]
    if arch not in TARGETS:
        raise ValueError(f"architecture {arch!r} has no Hugging Face counterpart here (gpt2 and llama have)")
    refused = refusals(arch, model.config)
    if refused:
        raise ValueError(f"a {arch} model with {'; '.join(refused)}: {TARGETS[arch]} cannot load it as it is")
    config, tensors = (gpt2_weights if arch == "gpt2" else llama_weights)(model)
    eot = tokenizer.eot_id
    config.update(bos_token_id=eot, eos_token_id=eot, torch_dtype=str(dtype).removeprefix("torch."))
    out = Path(out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    # every file is written in a temp folder inside out, then moved in: a full disk leaves out as it was
    stage = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        # contiguous copies: safetensors stores whole, unshared buffers (a transpose or a slice is a view)
        try:
            save_file({k: w.detach().to("cpu", dtype).contiguous().clone() for k, w in tensors.items()},
                      str(stage / "model.safetensors"), metadata={"format": "pt"})
        except SafetensorError as e:   # its word for an I/O error, e.g. "No space left on device (os error 28)"
            raise OSError(None, str(e).split("I/O error: ")[-1].split(" (os error")[0],
                          str(out / "model.safetensors")) from None
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        # safetensors makes its file 0600: given the mode of the others (0666 less the umask, as open() gives)
        os.chmod(stage / "model.safetensors", (stage / "config.json").stat().st_mode & 0o777)
        write_tokenizer(tokenizer, stage, model.context_length)
        for f in stage.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made and not any(out.iterdir()):
            out.rmdir()
    return out


def push_to_hub(folder, repo):
    """Upload folder to the Hugging Face model repository `repo` (created if needed) -> its URL; a one-line
    ValueError when the hub is unreachable or refuses."""
    later = f"the folder is written: upload it later with `hf upload {repo} {folder}`"
    online, why = model_lib.hub_reachable()
    if not online:
        raise ValueError(f"--push_to_hub {repo}: {why}; {later}")
    import huggingface_hub
    try:
        huggingface_hub.create_repo(repo, exist_ok=True)
        return huggingface_hub.upload_folder(repo_id=repo, folder_path=str(folder),
                                             commit_message="export.py: a lmscratch checkpoint")
    except Exception as e:   # not logged in, no write access, a bad name: the hub's first line says which
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"--push_to_hub {repo}: {first}; {later}") from None


def main():
    parser = argparse.ArgumentParser(description="Export a train.py checkpoint as a Hugging Face folder "
                                     "(transformers loads it with no custom code).",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ckpt", type=os.path.expanduser, default=os.path.join("out", "ckpt.pt"),
                        help="checkpoint written by train.py (either model.py architecture)")
    parser.add_argument("--out", type=os.path.expanduser, default=os.path.join("out", "hf"),
                        help="folder to write (refused when it exists and is not empty, unless --force)")
    parser.add_argument("--tokenizer", type=os.path.expanduser, default=None,
                        help="instead of the checkpoint's tokenizer: gpt2 or a bpe.py tokenizer folder (it must "
                             "be the one the model was trained with)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="dtype of the exported weights")
    parser.add_argument("--force", action="store_true", help="write into an --out folder that already has files")
    parser.add_argument("--push_to_hub", default=None, metavar="REPO",
                        help="then upload the folder to this Hugging Face model repository (e.g. me/ts-1m)")
    bpe.one_line_errors(parser)
    args = parser.parse_args()

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"export.py: --out {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise SystemExit(f"export.py: --out {out}: the folder exists and is not empty (pass --force to write into it)")
    try:
        bpe.check_output_path(out, "--out", folder=True)
    except ValueError as e:
        raise SystemExit(f"export.py: {e}") from None
    try:
        model, tokenizer = load_model_and_tokenizer(args.ckpt, None, "cpu", args.tokenizer)
        export(model, tokenizer, out, DTYPES[args.dtype])
    except ValueError as e:
        raise SystemExit(f"export.py: --ckpt {args.ckpt}: {e}" if not str(e).startswith("--") else f"export.py: {e}")
    except OSError as e:   # a full disk: export() leaves the folder as it was
        raise SystemExit(f"export.py: --out {out}: could not write {Path(e.filename or out).name} "
                         f"({bpe.write_error(e)}); the folder is as it was: free some space, then run again")
    print(f"wrote {out} ({model_lib.describe(model)}, {args.dtype}): "
          f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    if args.push_to_hub:
        try:
            print(f"uploaded: {push_to_hub(out, args.push_to_hub)}")
        except ValueError as e:
            raise SystemExit(f"export.py: {e}")


if __name__ == "__main__":
    main()
