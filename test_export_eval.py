"""Tests of export.py (a checkpoint as a Hugging Face folder) and eval.py (lm-evaluation-harness over our models),
and of the figures hellaswag.py / lambada.py share with the harness. Self-contained: tiny models and tokenizers of
their own. The references: transformers (GPT2LMHeadModel, LlamaForCausalLM, AutoTokenizer, generate) and lm-eval's
own Hugging Face backend (`--model hf`) on the exported folder.

Run: python -m pytest test_export_eval.py -q   (no network; the real-text tests skip without ../shared/data)
"""
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import bpe
import export
import hellaswag
import lambada
import model as M
import sample

ROOT = Path(__file__).resolve().parent
DATA = ROOT.parent / "shared" / "data"
TIKTOKEN_CACHE = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or ROOT.parent / "shared" / "tiktoken_cache")
if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)
GPT2_CACHED = all((TIKTOKEN_CACHE / h).is_file() for h in ("6c7ea1a7e38e3a7f062df639a5b80947f075ffe6",
                                                            "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"))
needs_gpt2_files = pytest.mark.skipif(not GPT2_CACHED, reason=f"GPT-2's tokenizer files are not in {TIKTOKEN_CACHE}")
HS_SUBSET = DATA / "hellaswag" / "hellaswag_val_subset.jsonl"

transformers = pytest.importorskip("transformers")
try:
    import eval as harness   # eval.py (named as the spec names it)
    import lm_eval
    import lm_eval.evaluator
except ImportError:
    harness = lm_eval = None
needs_lm_eval = pytest.mark.skipif(lm_eval is None, reason="lm-eval is not installed (requirements-eval.txt)")

EOT = "<|endoftext|>"
# a few lines of everyday text, for a tokenizer of our own that every test can have (no ../shared needed)
CORPUS = """A man is sitting on a roof. He starts pulling up roofing on the roof. The man climbs down the ladder.
A woman bakes bread in the kitchen. She kneads the dough and puts it in the oven, then she waits.
How to clean a bike chain. Put the bike on a stand. Spray the chain with degreaser and scrub it with a brush.
The children built a snowman out of snow. They gave it a carrot nose and two stones for eyes.
"Come in," she said, and smiled. He said  hello, and the dog barked twice at the door!
"""


@pytest.fixture(autouse=True)
def _no_environment_report(monkeypatch):
    """lm-eval records the machine in every result (torch's collect_env: seconds of subprocesses per run): not here."""
    if lm_eval is not None:
        monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda storage: None)


def _one_line(message, *named):
    """A bad-input error is one line that starts with the script and names the values."""
    assert "\n" not in message and all(str(n) in message for n in named), (message, named)


def _run(script, monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", *map(str, argv)])
    script.main()


def _exits(script, monkeypatch, *argv):
    with pytest.raises(SystemExit) as e:
        _run(script, monkeypatch, *argv)
    assert isinstance(e.value.code, str), e.value.code
    return e.value.code


# -----------------------------------------------------------------------------
# tiny tokenizers and checkpoints


def _train_tokenizer(folder, text, vocab_size):
    """A bpe.py tokenizer trained on text (one worker), saved as a tokenizer folder -> (folder, Tokenizer)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text(text, encoding="utf-8")
    vocab, merges = bpe.train_bpe(folder / "corpus.txt", vocab_size, [EOT], num_workers=1)
    tok = bpe.Tokenizer(vocab, merges, [EOT])
    tok.save_dir(folder / "tok")
    return folder / "tok", bpe.load_tokenizer(folder / "tok")


def _checkpoint(path, arch, tok_ref, vocab_size, context_length=64, seed=0, **config):
    """A train.py-format checkpoint of a random tiny model -> (path, model)."""
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = dict(arch="llama", vocab_size=vocab_size, context_length=context_length, d_model=32, num_layers=2,
                   num_heads=4, **config)
    else:
        cfg = dict(arch="gpt2", vocab_size=vocab_size, block_size=context_length, n_layer=2, n_head=4, n_embd=32,
                   **config)
    model = M.build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:   # norm gains and biases off their 1 / 0 init: a weight mapped to the wrong place shows
                p.uniform_(0.5, 1.5)
            elif arch == "gpt2":   # its init (std 0.02) gives near-uniform distributions, where near-ties pick
                p.mul_(3.0)
    torch.save({"model": model.state_dict(), "model_config": model.model_config(), "tokenizer": str(tok_ref),
                "tokenizer_fingerprint": bpe.tokenizer_fingerprint(tok_ref), "iteration": 0}, path)
    return path, model


@pytest.fixture(scope="module")
def own_tok(tmp_path_factory):
    return _train_tokenizer(tmp_path_factory.mktemp("own"), CORPUS * 3, 320)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, own_tok):
    """{arch: (checkpoint, our model, export folder)}: one of each architecture, exported with export.py's main.
    GPT-2 pads its vocabulary (the padded rows must not reach the folder); Llama has a RoPE theta of its own."""
    tok_dir, tok = own_tok
    out = {}
    for arch, config in [("llama", dict(rope_theta=500.0)), ("gpt2", dict(pad_vocab_to_multiple_of=64))]:
        d = tmp_path_factory.mktemp(arch)
        ckpt, model = _checkpoint(d / "ckpt.pt", arch, tok_dir, tok.vocab_size, context_length=512, **config)
        mp = pytest.MonkeyPatch()
        try:
            _run(export, mp, "--ckpt", ckpt, "--out", d / "hf")
        finally:
            mp.undo()
        out[arch] = ckpt, model, d / "hf"
    return out


# -----------------------------------------------------------------------------
# export.py: weights


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_export_logits_equal_the_project_model(exported, arch):
    _, ours, folder = exported[arch]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[arch]
    assert hf.config.vocab_size == ours.vocab_size   # GPT-2's padded rows were dropped
    idx = torch.randint(0, ours.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, M.logits(ours, idx), atol=1e-5, rtol=0)


def test_export_llama_config_carries_theta_eps_and_an_untied_head(exported):
    _, ours, folder = exported["llama"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["rope_theta"], config["rms_norm_eps"], config["tie_word_embeddings"]) == (500.0, 1e-5, False)
    assert (config["intermediate_size"], config["max_position_embeddings"]) == (ours.config.d_ff, 512)
    # the rotation convention is what the export changes: without the q/k permutation the logits differ
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        for layer, block in zip(hf.model.layers, ours.layers):
            layer.self_attn.q_proj.weight.copy_(block.attn.q_proj.weight)
            layer.self_attn.k_proj.weight.copy_(block.attn.k_proj.weight)
        idx = torch.arange(40)[None] % ours.vocab_size
        assert (hf(idx).logits - M.logits(ours, idx)).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_export_greedy_generate_equals_sample_generate(exported, own_tok, arch):
    _, ours, folder = exported[arch]
    tok = own_tok[1]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = tok.encode("The children built a")
    want = sample.generate(ours, [prompt], 24, temperature=0, stop_token=tok.eot_id)[0]
    assert want
    got = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=tok.eot_id)
    got = got[0, len(prompt):].tolist()
    assert got[:len(want)] == want and got[len(want):] in ([], [tok.eot_id])   # transformers keeps the eos


def test_export_dtype_is_the_weights_dtype(tmp_path, monkeypatch, exported):
    ckpt, _, _ = exported["gpt2"]
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf", "--dtype", "bfloat16")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="auto")
    assert hf.transformer.wte.weight.dtype == torch.bfloat16


# -----------------------------------------------------------------------------
# export.py: tokenizer


def _shared_text(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared/data): real-text test skipped")
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["tinystories/tinystories_sample.txt", "webtext/openwebtext_sample.txt"])
def test_export_autotokenizer_ids_equal_bpe_py(tmp_path, monkeypatch, name):
    text = _shared_text(name)
    tok_dir, tok = _train_tokenizer(tmp_path, text[:100_000], 600)
    ckpt, _ = _checkpoint(tmp_path / "ckpt.pt", "llama", tok_dir, tok.vocab_size)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    # the whole file, a document at a time (both tokenizers cut at <|endoftext|> first; one 3 MB string is slow in
    # tokenizers), and the start of it as one string, separators and all
    docs = text.split(EOT)
    assert auto(docs)["input_ids"] == [tok.encode(d) for d in docs]
    ids = tok.encode(text[:20_000])
    assert auto(text[:20_000])["input_ids"] == ids and (EOT not in text or tok.eot_id in ids)
    assert auto.decode(ids) == tok.decode(ids)
    assert (auto.eos_token, auto.eos_token_id) == (EOT, tok.eot_id)


@needs_gpt2_files
def test_export_gpt2_tokenized_run_gets_gpt2s_files(tmp_path, monkeypatch):
    import tiktoken
    ckpt, _ = _checkpoint(tmp_path / "ckpt.pt", "gpt2", "gpt2", 50257, context_length=16)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    assert (tmp_path / "hf" / "vocab.json").read_bytes() == (TIKTOKEN_CACHE / "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"
                                                             ).read_bytes()
    assert (tmp_path / "hf" / "merges.txt").read_bytes() == (TIKTOKEN_CACHE / "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
                                                             ).read_bytes()
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    path = DATA / "webtext" / "openwebtext_sample.txt"
    text = path.read_text(encoding="utf-8") if path.is_file() else CORPUS + EOT + CORPUS.upper()
    assert auto(text)["input_ids"] == tiktoken.get_encoding("gpt2").encode(text, allowed_special="all")


# -----------------------------------------------------------------------------
# export.py: bad input, the hub


@pytest.mark.parametrize("switch, value", [("remove_rope", True), ("use_post_norm", True), ("remove_rmsnorm", True),
                                           ("ffn_type", "silu")])
def test_export_refuses_llama_ablations_hf_cannot_express(tmp_path, monkeypatch, own_tok, switch, value):
    ckpt, _ = _checkpoint(tmp_path / "ckpt.pt", "llama", own_tok[0], own_tok[1].vocab_size, **{switch: value})
    message = _exits(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    _one_line(message, "export.py: --ckpt", ckpt, f"{switch}={value!r}", "LlamaForCausalLM")
    assert not (tmp_path / "hf").exists()


def test_export_refuses_an_unknown_architecture(tmp_path, monkeypatch, exported):
    ckpt = torch.load(exported["llama"][0], weights_only=True)
    ckpt["model_config"]["arch"] = "mamba"
    torch.save(ckpt, tmp_path / "ckpt.pt")
    _one_line(_exits(export, monkeypatch, "--ckpt", tmp_path / "ckpt.pt", "--out", tmp_path / "hf"),
              "export.py: --ckpt", "'mamba'")


def test_export_refuses_a_folder_with_files_unless_forced(tmp_path, monkeypatch, exported):
    ckpt = exported["gpt2"][0]
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    _one_line(_exits(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf"), "export.py: --out", "--force")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["notes.txt"]
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf", "--force")
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "notes.txt").read_text() == "mine"


def test_export_a_tokenizer_that_does_not_match_is_refused_by_its_fingerprint(tmp_path, monkeypatch, exported,
                                                                               own_tok):
    other_dir, other = _train_tokenizer(tmp_path, CORPUS.upper() * 3, own_tok[1].vocab_size)  # same size, other tokens
    assert other.vocab_size == own_tok[1].vocab_size
    message = _exits(export, monkeypatch, "--ckpt", exported["llama"][0], "--out", tmp_path / "hf",
                     "--tokenizer", other_dir)
    _one_line(message, "export.py: --ckpt", "fingerprint", other_dir)


class _FakeHub:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo, exist_ok=False):
        self.calls.append(("create_repo", repo, exist_ok))

    def upload_folder(self, repo_id, folder_path, commit_message=None):
        self.calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))
        return f"https://huggingface.co/{repo_id}/commit/0"


def test_export_push_to_hub_uploads_the_folder(tmp_path, monkeypatch, capsys, exported):
    import huggingface_hub
    hub = _FakeHub()
    monkeypatch.setattr(huggingface_hub, "create_repo", hub.create_repo)
    monkeypatch.setattr(huggingface_hub, "upload_folder", hub.upload_folder)
    monkeypatch.setattr(M, "hub_reachable", lambda timeout=3.0: (True, ""))
    _run(export, monkeypatch, "--ckpt", exported["llama"][0], "--out", tmp_path / "hf", "--push_to_hub", "me/tiny")
    files = ["config.json", "merges.txt", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert hub.calls == [("create_repo", "me/tiny", True), ("upload_folder", "me/tiny", files)]
    assert capsys.readouterr().out.splitlines()[-1] == "uploaded: https://huggingface.co/me/tiny/commit/0"


def test_export_push_to_hub_offline_is_one_line_and_keeps_the_folder(tmp_path, monkeypatch, exported):
    monkeypatch.setattr(M, "hub_reachable", lambda timeout=3.0: (False, "cannot reach huggingface.co (no network)"))
    message = _exits(export, monkeypatch, "--ckpt", exported["llama"][0], "--out", tmp_path / "hf",
                     "--push_to_hub", "me/tiny")
    _one_line(message, "export.py: --push_to_hub me/tiny", "cannot reach huggingface.co", "hf upload me/tiny")
    assert (tmp_path / "hf" / "model.safetensors").is_file()


# -----------------------------------------------------------------------------
# eval.py: the bridge against hellaswag.py and against lm-eval's own Hugging Face backend

# hand-written rows in the original rowanz format (one WikiHow-style row with the [title] markers lm-eval removes)
HS_ROWS = [
    dict(activity_label="Roof shingle removal", ctx_a="A man is sitting on a roof.", ctx_b="he",
         endings=["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                  "is holding a rubik's cube.", "starts pulling up roofing on a roof."], label=3),
    dict(activity_label="Baking cookies", ctx_a="A woman bakes bread in the kitchen.", ctx_b="she",
         endings=["kneads the dough and puts it in the oven.", "climbs down the ladder.",
                  "gave it a carrot nose.", "barked twice."], label=0),
    dict(activity_label="Cleaning a bike", ctx_a="How to clean a bike chain. [title] Put the bike on a stand.",
         ctx_b="[step] spray", endings=["the chain with degreaser and scrub it with a brush.", "the snowman.",
                                        "a roof on the chain.", "twice at the door."], label=0),
    dict(activity_label="Building a snowman", ctx_a="The children went outside.", ctx_b="they",
         endings=["built a snowman out of snow.", "said hello.", "put it in the oven.", "smiled at the dog."], label=0),
]


def _hs_rows():
    """The hand-written rows, then the first 8 of ../shared's HellaSwag subset when it is there."""
    rows = [dict(r, ind=i, ctx=f"{r['ctx_a']} {r['ctx_b']}", split="val", split_type="indomain", source_id="test")
            for i, r in enumerate(HS_ROWS)]
    if HS_SUBSET.is_file():
        rows += [json.loads(line) for line in HS_SUBSET.read_text(encoding="utf-8").splitlines()[:8]]
    return rows


def _write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _task(folder, name, split, data, include=None, **fields):
    """A task YAML in folder (JSON is YAML): a shipped task read from another file, or one of its own."""
    cfg = dict(include=str(include)) if include else {}
    cfg.update(task=name, dataset_path="json", dataset_kwargs={"data_files": {split: str(data)}}, **fields)
    (Path(folder) / f"{name}.yaml").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


# a multiple-choice task rendered as hellaswag.py renders HellaSwag: the context, then " " + each ending
AS_HELLASWAG_PY = dict(output_type="multiple_choice", validation_split="validation", doc_to_text="{{ctx}}",
                       doc_to_target="{{label}}", doc_to_choice="endings",
                       metric_list=[dict(metric="acc", aggregation="mean", higher_is_better=True),
                                    dict(metric="acc_norm", aggregation="mean", higher_is_better=True)])


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A folder of tasks on small local files: the shipped hellaswag_local and lambada_openai_local on them, and
    HellaSwag rendered as hellaswag.py renders it (context, then " " + ending)."""
    d = tmp_path_factory.mktemp("tasks")
    hs = _write_jsonl(d / "hs.jsonl", _hs_rows())
    _task(d, "hs_test", "validation", hs, include=ROOT / "tasks" / "hellaswag_local.yaml")
    _task(d, "hs_nanogpt", "validation", hs, **AS_HELLASWAG_PY)
    _task(d, "lambada_test", "test", _write_jsonl(d / "lambada.jsonl", [{"text": t} for t in LAMBADA_TEXTS]),
          include=ROOT / "tasks" / "lambada_openai_local.yaml")
    return d


def _lm_eval(model, tasks_dir, task, **kw):
    """lm-eval on `task` of tasks_dir, local tasks only (lm-eval's thousands of own YAMLs take long to index)."""
    if not isinstance(model, str):   # the bridge, through eval.py's own call
        return harness.evaluate(model, [task], include_path=[tasks_dir], bootstrap_iters=0, log_samples=True)
    manager = lm_eval.tasks.TaskManager(include_path=[str(tasks_dir), str(ROOT / "tasks")], include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=[task], task_manager=manager, bootstrap_iters=0,
                                   log_samples=True, **kw)


def _hf_lm_eval(folder, tasks_dir, task):
    """lm-eval's own `--model hf` on an exported folder."""
    return _lm_eval("hf", tasks_dir, task, model_args=dict(pretrained=str(folder), dtype="float32"), device="cpu",
                    batch_size=8)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # lm-eval's HF backend and transformers: local files only


@needs_lm_eval
def test_eval_bridge_picks_what_hellaswag_py_picks_under_the_same_rendering(exported, own_tok, tasks):
    _, model, _ = exported["llama"]
    tok = own_tok[1]
    out = _lm_eval(harness.HarnessLM(model, tok, batch_size=5), tasks, "hs_nanogpt")
    samples = sorted(out["samples"]["hs_nanogpt"], key=lambda s: s["doc_id"])
    rows = _hs_rows()
    assert len(samples) == len(rows)
    for s, row in zip(samples, rows):   # lm-eval's acc_norm is hellaswag.py's acc_norm_char, example by example
        tokens, mask, _ = hellaswag.render_example(row, tok, model.context_length)
        sum_loss, _ = hellaswag.score_endings(model, tokens, mask)
        assert [r[0] for r in s["filtered_resps"]] == pytest.approx((-sum_loss).tolist(), abs=1e-4)
        one = hellaswag.evaluate(model, tok, [row], "cpu")
        assert (s["acc"], s["acc_norm"]) == (one["acc"], one["acc_norm_char"])
    ours = hellaswag.evaluate(model, tok, rows, "cpu")
    assert "num_cut" not in ours and ours["num_skipped"] == 0   # the same text scored, nothing cut to fit
    res = out["results"]["hs_nanogpt"]
    assert (res["acc,none"], res["acc_norm,none"]) == (pytest.approx(ours["acc"]), pytest.approx(ours["acc_norm_char"]))


@needs_lm_eval
def test_eval_bridge_equals_lm_eval_hf_on_the_exported_folder(exported, own_tok, tasks, offline):
    _, model, folder = exported["llama"]
    ours = _lm_eval(harness.HarnessLM(model, own_tok[1], batch_size=3), tasks, "hs_test")
    ref = _hf_lm_eval(folder, tasks, "hs_test")
    for key in ("acc,none", "acc_norm,none"):
        assert ours["results"]["hs_test"][key] == ref["results"]["hs_test"][key]
    for a, b in zip(*(sorted(r["samples"]["hs_test"], key=lambda s: s["doc_id"]) for r in (ours, ref))):
        assert a["arguments"] == b["arguments"]   # lm-eval's preprocessing of the shipped task reached both
        assert [r[0] for r in a["filtered_resps"]] == pytest.approx([r[0] for r in b["filtered_resps"]], abs=1e-4)
    context = next(s["arguments"] for s in ours["samples"]["hs_test"] if s["doc_id"] == 2)[0][0]
    assert context == "Cleaning a bike: How to clean a bike chain.. Put the bike on a stand. spray"   # lm-eval's text


class _Words:
    """A word-level stand-in tokenizer: " word" pieces, the space with the word (as GPT-2's), id 0 unused."""

    def __init__(self, words):
        self.ids = {w: i + 1 for i, w in enumerate(words)}
        self.vocab_size, self.eot_id = len(words) + 1, None

    def encode(self, text):
        return [self.ids[w] for w in re.findall(r" ?\S+", text)]


class _Unigram(torch.nn.Module):
    """Next-token log-probabilities that ignore the context."""

    def __init__(self, logp):
        super().__init__()
        self.logp, self.context_length = torch.nn.Parameter(logp), 16

    def forward(self, idx):
        return self.logp.expand(*idx.shape, -1)


@needs_lm_eval
def test_hellaswag_acc_norm_char_divides_by_the_endings_characters_as_lm_eval(tmp_path):
    # one row where the rules disagree: the 9-character ending (the label) costs 9 nats, 1 per character and 9 per
    # token; the 1-character "b" costs 1.05. Per character picks the label; per token and summed pick "b", and so
    # would a division by the length with its joining space (0.9 against 0.525)
    tok = _Words(["The", " cat", " aaaaaaaaa", " b", " c", " d"])
    p = torch.tensor([0.0, 1e-3, 1e-3, *torch.tensor([9.0, 1.05, 10.0, 10.0]).neg().exp()])
    p[0] = 1 - p.sum()   # the rest of the mass on the unused id: the logits are exact log-probabilities
    model = _Unigram(p.log())
    row = dict(ind=0, ctx="The cat", endings=["aaaaaaaaa", "b", "c", "d"], label=0)
    r = hellaswag.evaluate(model, tok, [row], "cpu")
    assert (r["acc"], r["acc_norm"], r["acc_norm_char"]) == (0.0, 0.0, 1.0)
    _task(tmp_path, "hs_one", "validation", _write_jsonl(tmp_path / "one.jsonl", [row]), **AS_HELLASWAG_PY)
    res = _lm_eval(harness.HarnessLM(model, tok), tmp_path, "hs_one")["results"]["hs_one"]
    assert (res["acc,none"], res["acc_norm,none"]) == (0.0, 1.0)


# LAMBADA passages: ordinary ones, and the case lm-eval's tokenisation decides: two spaces before the last word
LAMBADA_TEXTS = [
    "The children built a snowman out of snow. They gave it a carrot nose and two stones for eyes",
    "A woman bakes bread in the kitchen. She kneads the dough and puts it in the oven",
    '"Come in," she said, and smiled. He said  hello',
    "The man climbs down the ladder and sits on the roof.  Then he starts pulling up the roofing",
]


@needs_lm_eval
def test_lambada_py_scores_a_double_space_as_the_harness_does(exported, own_tok, tasks, offline):
    _, model, folder = exported["gpt2"]
    tok = own_tok[1]
    tokens, num_target, _ = lambada.render_example({"text": LAMBADA_TEXTS[2]}, tok)
    # the space left at the end of the context went to the target: it is predicted, then " hello"
    assert tok.decode(tokens[-num_target:]) == "  hello" and tok.decode(tokens[-num_target:][:1]) == " "
    lm = harness.HarnessLM(model, tok)
    for text in LAMBADA_TEXTS:   # lm-eval's own tokenisation of the task's (context, target)
        context, target = " ".join(text.split(" ")[:-1]), " " + text.split(" ")[-1]
        ctx_ids, tgt_ids = lm._encode_pair(context, target)
        assert lambada.render_example({"text": text}, tok) == (ctx_ids + tgt_ids, len(tgt_ids), False)
    ours = lambada.evaluate(model, tok, [{"text": t} for t in LAMBADA_TEXTS], "cpu")
    ref = _hf_lm_eval(folder, tasks, "lambada_test")["results"]["lambada_test"]
    assert ours["acc"] == ref["acc,none"] and ours["ppl"] == pytest.approx(ref["perplexity,none"], rel=1e-5)


# -----------------------------------------------------------------------------
# eval.py: the other two request types, against lm-eval's HF backend


def _requests(kind, args):
    from lm_eval.api.instance import Instance
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def _hflm(folder):
    from lm_eval.models.huggingface import HFLM
    return HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=4)


@needs_lm_eval
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_eval_loglikelihood_rolling_equals_lm_eval_hf(tmp_path, monkeypatch, own_tok, offline, arch):
    tok_dir, tok = own_tok
    ckpt, model = _checkpoint(tmp_path / "ckpt.pt", arch, tok_dir, tok.vocab_size, context_length=32)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    docs = [(CORPUS,), (CORPUS[:40],), ("x",)]   # many windows of the context, one, a single token
    assert len(tok.encode(CORPUS)) > 4 * 32
    got = harness.HarnessLM(model, tok, batch_size=3).loglikelihood_rolling(
        _requests("loglikelihood_rolling", docs), disable_tqdm=True)
    want = _hflm(tmp_path / "hf").loglikelihood_rolling(_requests("loglikelihood_rolling", docs), disable_tqdm=True)
    assert got == pytest.approx(want, rel=1e-5)


@needs_lm_eval
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_eval_generate_until_equals_lm_eval_hf(exported, own_tok, offline, arch):
    lm = harness.HarnessLM(exported[arch][1], own_tok[1], batch_size=2)
    args = [("The children built a", {"until": ["."], "max_gen_toks": 20, "do_sample": False}),
            ("He said", {"until": ["\n", "and"], "max_gen_toks": 12}),
            ("A woman bakes bread in the kitchen. She", {"until": ["."], "max_gen_toks": 20, "do_sample": False})]
    got = lm.generate_until(_requests("generate_until", args), disable_tqdm=True)
    want = _hflm(exported[arch][2]).generate_until(_requests("generate_until", args), disable_tqdm=True)
    assert got == want and any(got)


# -----------------------------------------------------------------------------
# eval.py: the command line


@needs_lm_eval
def test_eval_cli_prints_lm_evals_table_and_writes_its_json(tmp_path, monkeypatch, capsys, exported, tasks):
    ckpt = exported["gpt2"][0]
    _run(harness, monkeypatch, "--ckpt", ckpt, "--tasks", "hs_nanogpt", "--include_path", tasks, "--limit", 3,
         "--bootstrap_iters", 0, "--device", "cpu", "--output", tmp_path / "r.json")
    out = capsys.readouterr().out
    assert re.search(r"^\|hs_nanogpt *\|.*\|acc *\|", out, re.M)   # lm-eval's table
    assert out.splitlines()[-1] == f"results: {tmp_path / 'r.json'}"
    results = json.loads((tmp_path / "r.json").read_text())
    assert set(results["results"]["hs_nanogpt"]) >= {"acc,none", "acc_norm,none"} and "samples" not in results
    assert results["config"]["model_args"]["ckpt"] == str(ckpt)


@needs_lm_eval
def test_eval_default_output_is_beside_the_checkpoint(tmp_path, monkeypatch, capsys, exported, tasks):
    ckpt = tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(Path(exported["gpt2"][0]).read_bytes())
    _run(harness, monkeypatch, "--ckpt", ckpt, "--tasks", "hs_nanogpt", "--include_path", tasks, "--limit", 1,
         "--bootstrap_iters", 0, "--device", "cpu")
    assert (tmp_path / "run" / "ckpt_lm_eval.json").is_file()


@needs_lm_eval
def test_eval_unknown_task_is_lm_evals_message_in_one_line(monkeypatch, exported, tasks):
    monkeypatch.setattr(harness, "TaskManager", lambda include_path, include_defaults=True:
                        lm_eval.tasks.TaskManager(include_path=include_path, include_defaults=False))
    message = _exits(harness, monkeypatch, "--ckpt", exported["gpt2"][0], "--tasks", "hellaswag_lokal",
                     "--device", "cpu")
    _one_line(message, "eval.py: --tasks", "'hellaswag_lokal'", "not a registered task")


@needs_lm_eval
def test_eval_a_local_tasks_missing_data_is_one_line(tmp_path, monkeypatch, exported):
    _task(tmp_path, "hs_gone", "validation", tmp_path / "not_downloaded.jsonl",
          include=ROOT / "tasks" / "hellaswag_local.yaml")
    message = _exits(harness, monkeypatch, "--ckpt", exported["gpt2"][0], "--tasks", "hs_gone", "--include_path",
                     tmp_path, "--device", "cpu")
    _one_line(message, "eval.py: --tasks hs_gone", "not_downloaded.jsonl", "hellaswag.py")


@needs_lm_eval
@pytest.mark.parametrize("argv, named", [(["--limit", "0"], "--limit"), (["--batch_size", "0"], "--batch_size"),
                                         (["--num_fewshot", "-1"], "--num_fewshot"), (["--tasks", ","], "--tasks"),
                                         (["--include_path", "/no/such/folder"], "/no/such/folder"),
                                         (["--init_from", "gpt2"], "not both")])
def test_eval_bad_flags_are_one_line_before_any_work(monkeypatch, argv, named):
    args = dict(zip(["--tasks", "--ckpt"], ["hs_nanogpt", "ckpt.pt"]))
    args.update(zip(argv[::2], argv[1::2]))
    _one_line(_exits(harness, monkeypatch, *[x for kv in args.items() for x in kv]), "eval.py: ", named)


@needs_lm_eval
def test_eval_a_tokenizer_that_does_not_match_is_refused(tmp_path, monkeypatch, exported):
    other_dir, other = _train_tokenizer(tmp_path, CORPUS, 300)   # another size
    message = _exits(harness, monkeypatch, "--ckpt", exported["gpt2"][0], "--tasks", "hs_nanogpt",
                     "--tokenizer", other_dir, "--device", "cpu")
    _one_line(message, "eval.py: --ckpt", other_dir, "300 tokens")


def test_eval_without_lm_eval_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)   # import lm_eval now fails, as when it is not installed
    spec = importlib.util.spec_from_file_location("eval_without_lm_eval", ROOT / "eval.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    message = _exits(script, monkeypatch, "--ckpt", "ckpt.pt", "--tasks", "hellaswag")
    assert message == "eval.py: lm-eval is not installed: pip install -r requirements-eval.txt"
