"""Mutation testing of test_all.py: each mutant changes one piece of a script the way a slip would (a wrong number, a
refusal that no longer comes, a file written wrong); the tests chosen for it must then fail.

    python mutants.py                     # every mutant against this checkout's test_all.py
    python mutants.py -k adamw            # the mutants whose name holds "adamw"
    python mutants.py --tests OLD.py      # the same mutants against another version of the suite
    python mutants.py -j 2 --list         # two at a time (each in its own copy); --list: print them only

A mutant is (name, file, an exact snippet of that file, its replacement, a pytest -k expression choosing the tests that
must catch it, why it matters). The script copies the repository's tracked files into temporary folders beside this
checkout (so that the tests find beside each copy the team's data they find beside the checkout), applies one
mutant at a time, runs `pytest test_all.py -x -q -k EXPR` there, puts the file back and says killed (a test failed) or
SURVIVED (all passed). A snippet that is not in its file exactly once is refused before anything runs; a selection of
no test (pytest's exit 5) or a collection error (exit 2: the mutant broke an import, which proves nothing) is an
ERROR, not a kill. Exit status 0 when every mutant is killed.
"""

import argparse
import concurrent.futures
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent

MUTANTS = [   # (name, file, snippet, replacement, -k, why)
    # ---- model.py: the building blocks and both models
    ("rmsnorm_sum", "model.py", "xf.pow(2).mean(-1, keepdim=True)", "xf.pow(2).sum(-1, keepdim=True)",
     "test_model_rmsnorm_matches_torch", "RMSNorm divides by the root of the mean square"),
    ("swiglu_gate_swapped", "model.py", "self.w2(silu(self.w1(x)) * self.w3(x))",
     "self.w2(silu(self.w3(x)) * self.w1(x))", "test_model_llama_matches_transformers", "the gate is W1 (gate_proj)"),
    ("rope_backward_sign", "model.py", "_rotate_pairs(grad, cos, -sin)", "_rotate_pairs(grad, cos, sin)",
     "test_model_rope_gradient", "a rotation's gradient is the rotation by minus the angle"),
    ("rope_frequencies", "model.py", "dtype=torch.float64) / d_k)", "dtype=torch.float64) / (d_k + 2))",
     "test_model_rope_matches_complex_rotation", "RoPE's frequencies are theta^(-2k/d_k)"),
    ("softmax_masked_row_nan", "model.py", "e.div_(e.sum(dim, keepdim=True).clamp(min=1.0))",
     "e.div_(e.sum(dim, keepdim=True))", "test_model_fully_masked_rows", "a fully masked row gives zeros, not NaN"),
    ("softmax_backward", "model.py", "(gf * pf).sum(ctx.dim, keepdim=True)", "(gf * pf).mean(ctx.dim, keepdim=True)",
     "test_model_softmax_matches_torch", "softmax's backward subtracts sum(g p)"),
    ("kv_cache_room", "model.py", "if self.pos + new_tokens > self.max_seq_len:",
     "if self.pos + new_tokens > self.max_seq_len + 1:", "test_model_kv_cache_refuses",
     "a full KV cache is refused, not written past"),
    ("cross_entropy_lse", "model.py", "(sum_exp.log() + m).squeeze(1)", "sum_exp.log().squeeze(1)",
     "test_model_cross_entropy_matches_torch", "log-sum-exp adds the max back"),
    ("decay_on_gains", "model.py", '[p for n, p in params if p.dim() < 2], "weight_decay": 0.0}',
     '[p for n, p in params if p.dim() < 2], "weight_decay": weight_decay}',
     "test_model_param_groups_decay_matrices_only or test_train_weight_decay_only_on_matrices",
     "biases and gains are not decayed"),
    ("ids_past_the_vocabulary", "model.py", "if lo < 0 or hi >= vocab_size:", "if lo < 0 or hi > vocab_size:",
     "test_model_refuses_a_sequence_longer or id-past-the-vocabulary", "id vocab_size is outside the embedding"),
    # ---- train.py: AdamW, Muon, the schedules, clipping
    ("adamw_decay_without_lr", "train.py", "p.mul_(1 - lr * wd)                          # decoupled",
     "p.mul_(1 - wd)                          # decoupled", "test_train_adamw", "decoupled decay is lr * wd"),
    ("adamw_bias2", "train.py", "bias2 = 1 - beta2 ** t", "bias2 = 1.0", "test_train_adamw_matches_torch",
     "the second moment's bias correction"),
    ("adamw_eps_inside_sqrt", "train.py", "denom = (v.sqrt() / bias2 ** 0.5).add_(eps)",
     "denom = ((v + eps).sqrt() / bias2 ** 0.5)", "test_train_adamw_matches_torch", "eps is added after the root"),
    ("muon_scale", "train.py", "alpha=-lr * 0.2 * max(p.shape) ** 0.5", "alpha=-lr * 0.2 * min(p.shape) ** 0.5",
     "test_train_muon_matches", "Muon's update RMS matches AdamW's: 0.2 sqrt(max(rows, cols))"),
    ("newton_schulz", "train.py", "X = a * X + (b * A + c * A @ A) @ X", "X = a * X + (b * A + c * A) @ X",
     "test_train_muon_matches or test_train_orthogonalise", "the quintic Newton-Schulz iteration"),
    ("cosine_shape", "train.py", "0.5 * (1 + math.cos(math.pi * progress))",
     "0.5 * (1 + math.cos(math.pi * progress / 2))", "test_train_cosine_schedule_points",
     "the cosine goes from max to min over the cycle"),
    ("cosine_warmup", "train.py",
     "        return max_learning_rate * it / warmup_iters\n    if it >= cosine_cycle_iters:",
     "        return max_learning_rate * (it + 1) / warmup_iters\n    if it >= cosine_cycle_iters:",
     "test_train_cosine_schedule_points", "CS336's warmup is lr * it / warmup"),
    ("wsd_decay_start", "train.py", "total_iters * (1 - cooldown_frac))", "total_iters * cooldown_frac)",
     "test_train_wsd_schedule_points", "the decay takes the last cooldown_frac of the run"),
    ("budget_schedule_ignores_steps", "train.py", "max(step, min(elapsed / budget, 1.0) * c[\"max_iters\"])",
     "min(elapsed / budget, 1.0) * c[\"max_iters\"]", "test_train_time_budget_schedule_follows_steps",
     "under a budget the schedule follows whichever of steps and clock is further"),
    ("warmup_from_one", "train.py", "if c[\"warmup_from_one\"] and it < warmup:",
     "if c[\"warmup_from_one\"] and it < warmup - 1:", "test_train_warmup_from_one",
     "build-nanogpt's warmup is lr * (it + 1) / warmup to the warmup's end"),
    ("min_lr_ratio", "train.py", "lo, length = peak * c[\"min_lr_ratio\"],", "lo, length = c[\"min_lr_ratio\"],",
     "test_train_optimizer_steps_with_the_scheduled_lr or test_train_warmup_from_one", "the floor is a ratio"),
    ("clip_never_caps", "train.py", "scale = torch.clamp(max_l2_norm / (norm + eps), max=1.0)",
     "scale = max_l2_norm / (norm + eps)", "test_train_gradient_clipping_matches_torch",
     "clipping only ever scales down"),
    # ---- train.py's get_batch and runs.py's samplers
    ("get_batch_last_window", "train.py", "high = len(dataset) - context_length   #",
     "high = len(dataset) - context_length - 1   #", "test_train_get_batch_windows or exactly_one_window",
     "the last window [len-T-1, len) can be drawn"),
    ("shards_drawn_uniformly", "runs.py", "self.p = sizes / sizes.sum()",
     "self.p = np.full(len(sizes), 1 / len(sizes))",
     "test_train_random_sampler_draws_every_window", "shards are drawn in proportion to their windows"),
    ("random_sampler_rank_seed", "runs.py", "np.random.default_rng([seed, rank])", "np.random.default_rng([seed, 0])",
     "test_train_random_sampler_ranks_draw_different", "each rank draws its own windows"),
    ("opening_piece_moved", "runs.py", "fixed = int(arr[0] != self.eot_id)", "fixed = 0",
     "test_train_sequential_sampler_keeps_a_shards_opening_piece_first", "a shard's opening piece stays first"),
    ("sequential_world_stride", "runs.py", "self.pos += self.span * self.world", "self.pos += self.span",
     "test_train_sequential_sampler_reads_the_first_epoch_as_build", "rank r of W takes every W-th window"),
    ("sequential_state_pos", "runs.py", '"shard": self.shard, "pos": self.pos}', '"shard": self.shard, "pos": 0}',
     "test_train_sequential_sampler_shuffles_documents_and_resumes", "the position is part of the resume state"),
    ("readahead_position", "runs.py",
     "return self.sampler.state_dict() if self.position is None else self.position",
     "return self.sampler.state_dict()", "test_train_resume_is_bit_identical",
     "a resume starts at the batch fetched but not yet trained on"),
    # ---- train.py: checkpoints, evaluation, settings
    ("val_loss_mean", "train.py", "    total /= eval_iters\n", "    total /= eval_iters + 1\n",
     "test_train_estimate_val_loss", "the validation loss is the mean over eval_iters batches"),
    ("bytes_per_token", "train.py", "/ max(1, len(ids))", "/ max(1, len(ids) - 1)",
     "test_train_bits_per_byte or test_train_bytes_per_token", "bits per byte: the bytes of the tokens scored"),
    ("checkpoint_temp_left", "train.py", "tmp.unlink(missing_ok=True)  # a failed", "pass  # a failed",
     "test_train_checkpoint_roundtrip or test_train_full_disk_at_a_checkpoint", "a failed write leaves no temp file"),
    ("eval_tokens_multiple", "train.py", "if c.eval_tokens % (c.batch_size * c.context_length * world):", "if False:",
     "eval_tokens", "--eval_tokens must be a multiple of a batch"),
    ("accumulation_steps", "train.py", "return total_batch_tokens // per_step",
     "return max(1, total_batch_tokens // per_step // 2)", "test_train_total_batch_tokens or accumulation",
     "accumulation makes up --total_batch_tokens"),
    ("flag_value_after_run_check", "train.py",
     '            model_lib.check_setting(f"--{name}", cfg[name], settings()[name][0])\n', "            pass\n",
     "test_train_readme_hacking_diff", "a bad flag value is named before another run's checkpoint is compared"),
    ("agreed_error_every_rank", "train.py",
     'raise SystemExit(f"train.py: {e}" if int(os.environ.get("RANK", "0")) == 0 else 1) from None',
     'raise SystemExit(f"train.py: {e}") from None', "ranks_that_disagree", "an agreed error is said by rank 0 alone"),
    # ---- runs.py: token files, resume, the run's folder and log
    ("parse_duration_hours", "runs.py", '{"s": 1, "m": 60, "h": 3600}', '{"s": 1, "m": 60, "h": 360}',
     "parse_duration", "1.5h is 5400 s"),
    ("token_file_size_trusted", "runs.py",
     'if size % dtype.itemsize or size // dtype.itemsize != meta.get("num_tokens"):', "if size % dtype.itemsize:",
     "test_train_token_file_shorter_than_its_sidecar or token-file-cut-short",
     "a token file shorter than its sidecar says is refused"),
    ("token_range", "runs.py", "if top >= vocab_size:", "if top > vocab_size:",
     "test_train_token_id_outside_the_vocabulary or token-id", "id vocab_size would index past the embedding"),
    ("batch_fits", "runs.py", "if len(arr) < need:", "if len(arr) < need - 1:",
     "test_train_too_short_validation_or_training_file or shorter-than-a-batch", "one batch needs B*T*world+1 tokens"),
    ("resume_settings_unchecked", "runs.py", "for k in asked if k not in resumable and old.get(k) != cfg[k]}",
     "for k in asked if False}", "test_train_resume_with_another_batch_size or another-batch_size",
     "a resume may not change what would make it another run"),
    ("same_run_any_tokenizer", "runs.py",
     'ckpt["train_files"] == data.train_files and trained_with == data.fingerprint)',
     'ckpt["train_files"] == data.train_files)',
     "test_a_tokenizer_retrained_into_its_folder or test_train_check_same_run",
     "--resume=auto continues only a run of this tokenizer"),
    ("model_fits_context", "runs.py", "if c.context_length > raw.context_length:",
     "if c.context_length > raw.context_length + 1:",
     "test_train_context_longer_than_the_checkpoints_model or a-longer-context",
     "a context longer than the model's is refused"),
    ("restore_world", "runs.py", "if same_data and saved_world != world:", "if False:",
     "test_train_resume_with_another_number_of_processes or another-number-of-processes",
     "a DDP run resumes on as many processes"),
    ("lr_scale", "train.py", 'group["lr"] = lr * group.get("lr_scale", 1)', 'group["lr"] = lr',
     "test_train_embedding_and_head_lr_scales", "--embedding_lr_scale / --head_lr_scale scale their groups"),
    ("ema_mean_first", "train.py", "weight = 1 - min(self.decay, 1 - 1 / step)", "weight = 1 - self.decay",
     "test_train_ema_averages_the_weights", "--ema averages the first steps' weights evenly"),
    ("ema_scored", "train.py", "with self.average.swapped_in(), whole_model(self.raw):",
     "with whole_model(self.raw):", "test_train_ema_averages_the_weights", "--ema's evaluations score the average"),
    ("ema_resume", "train.py", '        average.resume(ckpt["trained_weights"])\n', "        pass\n",
     "test_train_resume_is_bit_identical or test_train_fsdp_killed_mid_checkpoint",
     "a resumed --ema run trains on from its trained weights, not the average"),
    ("restore_rngs", "runs.py", "    set_rng_state(rng)\n", "\n", "test_train_resume_restores_the_global_rngs",
     "every RNG is restored"),
    ("log_kept_on_resume", "runs.py", 'return isinstance(record, dict) and record.get("step", 0) <= step',
     "return isinstance(record, dict)", "test_train_resume_log_has_each_record_once",
     "a resume drops the log records past its step"),
    ("finished_budget", "runs.py",
     "return self.step >= max_iters or (budget is not None and self.elapsed >= budget)",
     "return self.step >= max_iters", "test_train_time_budget_follows_injected_clock", "a spent budget ends the run"),
    ("time_left_budget", "runs.py", "return left if budget is None else max(0.0, min(left, budget - self.elapsed))",
     "return left", "test_train_log_records_the_time_left", "the time left is the budget left if sooner"),
    ("lock_not_exclusive", "runs.py", "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass",
     "test_train_two_runs_in_one_out_dir_are_refused", "two runs cannot share a folder"),
    ("plot_takes_broken_records", "runs.py",
     'if r.get("type") == "train" and all(k in r for k in ("step", "elapsed", "loss"))]',
     'if r.get("type") == "train"]', "test_train_plot_leaves_out_records_missing_a_figure",
     "--plot leaves out records missing a figure"),
    ("stale_shards_kept", "runs.py", "        if folder.name != keep:\n", "        if False:\n",
     "test_train_full_disk_at_a_sharded_checkpoint", "a committed FSDP checkpoint removes the older shards"),
    # ---- bpe.py
    ("bpe_reference_tie_break", "bpe.py", "best = max(pairs, key=lambda p: (pairs[p], p))",
     "best = max(pairs, key=lambda p: pairs[p])", "test_bpe_train_matches_the_reference or test_bpe_train_words",
     "the reference trainer breaks ties to the greater pair, as the fast one does"),
    ("bpe_rebuild_new_new", "bpe.py", 'if x == new:  # "a b a b"', 'if False:  # "a b a b"',
     "test_bpe_train_words_holding_a_pair", "adjacent sites add (new, new) once"),
    ("bpe_stale_heap_entry", "bpe.py", "if c != -negc:  # stale entry", "if c == 0:  # stale entry",
     "test_bpe_train_matches_the_reference", "a stale heap count is pushed again, not merged"),
    ("bpe_whole_pretoken", "bpe.py", "if whole is not None and b not in self._special_bytes:", "if False:",
     "test_bpe_a_pretoken_that_is_a_token", "a pre-token that is a token is that token (tiktoken)"),
    ("bpe_merge_lowest_rank", "bpe.py", "            r = min(ranks)\n", "            r = ranks[0]\n",
     "test_bpe_gpt2_files or test_bpe_roundtrip", "merges apply lowest rank first"),
    ("bpe_decode_negative", "bpe.py", "if any(i < 0 for i in ids):", "if False:", "test_bpe_decode_refuses",
     "a negative id is refused, not read from the end"),
    ("bpe_binary_input", "bpe.py", 'if b"\\x00" in head or bad > len(head) // 10:', "if bad > len(head) // 10:",
     "binary_input or input-binary", "a binary file is refused before training"),
    ("bpe_out_a_folder", "bpe.py", "if not folder and path.is_dir():", "if False:",
     "encode_out or encode-out-a-folder or broken_vocab", "an --out that is a folder is refused"),
    ("bpe_fingerprint_partial", "bpe.py",
     'h = hashlib.sha256()\n    for name in ("vocab.json", "merges.txt", "special_tokens.json"):',
     'h = hashlib.sha256()\n    for name in ("special_tokens.json",):', "fingerprint or retrained",
     "a retrained tokenizer changes its fingerprint"),
    ("bpe_fingerprint_unchecked", "bpe.py", "if fingerprint and now != fingerprint:", "if False:",
     "test_a_tokenizer_retrained_into_its_folder", "a same-size tokenizer of other tokens is refused"),
    ("bpe_chunk_count", "bpe.py",
     "num_chunks = max(min(num_workers, -(-size // min_chunk_bytes)), -(-size // chunk_bytes))",
     "num_chunks = max(num_workers, -(-size // chunk_bytes))", "test_bpe_a_small_file_is_one_chunk",
     "a small file is one chunk"),
    ("bpe_vocab_floor", "bpe.py", "if vocab_size < 256 + len(special_tokens):", "if vocab_size < 256:",
     "test_bpe_train_refuses_a_vocabulary_below", "the vocabulary holds the bytes and the special tokens"),
    # ---- sample.py
    ("top_p_inclusive", "sample.py", "keep = before < top_p * mass.sum(-1, keepdim=True)",
     "keep = before <= top_p * mass.sum(-1, keepdim=True)", "test_sample_top",
     "top-p keeps a token while the mass above it is below p"),
    ("top_k_one_more", "sample.py", "sp, si = sp[:, :top_k], si[:, :top_k]",
     "sp, si = sp[:, :top_k + 1], si[:, :top_k + 1]", "test_sample_top", "top-k keeps exactly k"),
    ("draw_zero_probability", "sample.py", "torch.searchsorted(cdf, x, right=True)",
     "torch.searchsorted(cdf, x, right=False)", "test_sample_draw or test_sample_next",
     "a zero-probability token is never drawn"),
    ("temperature_overflow", "sample.py", "F.softmax((logits - logits.amax(-1, keepdim=True)) / temperature, dim=-1)",
     "F.softmax(logits / temperature, dim=-1)", "test_sample_a_zero_or_vanishing_temperature or test_sample_temp",
     "a tiny temperature does not overflow to NaN"),
    ("prompt_not_forced", "sample.py", "tok = torch.where(pos < lengths, buf[:, pos], tok)", "pass",
     "test_sample_batched_prompts", "rows still in their prompt take the prompt's token"),
    ("one_token_too_many", "sample.py", "done[i] = len(out[i]) >= max_new_tokens",
     "done[i] = len(out[i]) > max_new_tokens", "test_sample_generate", "at most max_new_tokens"),
    ("stop_token_ignored", "sample.py", "                if t == stop_token:\n", "                if False:\n",
     "stops_at_end_of_text", "generation stops at the stop token"),
    ("prompt_keeps_its_start", "sample.py", "prompts = [p[-ctx:] for p in prompts]",
     "prompts = [p[:ctx] for p in prompts]",
     "keeps_its_last_tokens", "a prompt longer than the context keeps its last tokens"),
    # ---- fineweb.py
    ("fw_dtype_boundary", "fineweb.py", 'return "uint16" if vocab_size <= 2**16 else "uint32"',
     'return "uint16" if vocab_size < 2**16 else "uint32"', "test_fw_choose_dtype", "65536 ids fit in uint16"),
    ("fw_resume_offset", "fineweb.py", "flush(doc_index + done, pos - (ends[done - 1] if done else 0))",
     "flush(doc_index + done, 0)", "test_fw_resume_after_interruption or test_fw_every_shard_size",
     "a document cut by a shard resumes at its cut"),
    ("fw_changed_input", "fineweb.py", 'if diff == ["source"] and was == now and now.startswith("file:"):',
     "if False:", "test_fw_cli_refuses_shards_of_an_input_that_has_changed", "a changed input is named as such"),
    ("fw_longer_shard_trusted", "fineweb.py",
     'p.stat().st_size != s["num_tokens"] * np.dtype(config["dtype"]).itemsize',
     'p.stat().st_size < s["num_tokens"] * np.dtype(config["dtype"]).itemsize',
     "test_fw_a_listed_shard_of_the_wrong_size or shard-one-token-longer", "a listed shard of another size"),
    ("fw_fresh_removes_others_files", "fineweb.py", "if names.fullmatch(p.name)] if ours else []",
     'if p.suffix == ".bin"] if ours else []', "test_fw_cli_fresh_starts_a_shard_folder_over",
     "--fresh removes only what fineweb.py wrote"),
    ("fw_empty_input", "fineweb.py", "    if n_docs == 0:\n", "    if False:\n", "test_fw_empty_input",
     "an empty input leaves no token file"),
    ("fw_other_settings", "fineweb.py", "        if diff:\n", "        if False:\n",
     "test_fw_refuses_an_out_dir_written_with_other_settings or other-settings",
     "shards of other settings are not continued"),
    ("fw_foreign_token_files", "fineweb.py", 'if out.exists() and any(out.glob("*.bin")):', "if False:",
     "test_fw_refuses_an_out_dir_holding_token_files or foreign-token-files",
     "an out_dir of token files it did not write is refused"),
    # ---- eval.py
    ("eval_offline_retries", "eval.py", "        offline_mode()\n", "        pass\n", "test_eval_offline_a_hub_task",
     "offline, a hub task fails at once, naming the local tasks"),
    # ---- export.py
    ("export_rope_pairs", "export.py", "w.view(num_heads, -1, 2, w.size(1)).transpose(1, 2).reshape(w.shape)",
     "w.view(num_heads, -1, 2, w.size(1)).reshape(w.shape)", "test_export_logits_equal_the_project_model",
     "HF's Llama rotates halves, not adjacent pairs"),
    ("export_conv1d", "export.py", '"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight"',
     '"attn.c_attn.weight", "mlp.c_fc.weight"', "test_export_logits_equal_the_project_model",
     "GPT-2's Conv1D weights are transposed"),
    ("export_drops_a_field", "export.py", "if f.name not in known and value != default:", "if False:",
     "test_export_refuses", "a field HF cannot express is refused, not dropped"),
    ("export_rms_eps", "export.py", "rms_norm_eps=model.ln_final.eps", "rms_norm_eps=1e-2",
     "test_export_llama_config_carries", "config.json carries the norm's eps"),
    ("export_untied_head", "export.py", "if not c.tie_embeddings:", "if False:",
     "test_export_logits_equal_the_project_model", "an untied head is exported"),
]


def check(mutants):
    """Every name unique, every snippet exactly once in its file, every replacement a change."""
    names = [m[0] for m in mutants]
    if len(names) != len(set(names)):
        sys.exit("mutants.py: two mutants share a name")
    for name, path, snippet, replacement, _, _ in mutants:
        count = (ROOT / path).read_text(encoding="utf-8").count(snippet)
        if count != 1 or snippet == replacement:
            sys.exit(f"mutants.py: {name}: the snippet is in {path} {count} times, not once (or the replacement "
                     f"changes nothing): {snippet!r}")


def copy_repo(tests):
    """A new folder beside the checkout with its tracked files (test_all.py replaced by `tests` if given)."""
    dest = Path(tempfile.mkdtemp(prefix=f".{ROOT.name}-mutant-", dir=ROOT.parent))
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    if tests:
        shutil.copy2(tests, dest / "test_all.py")
    return dest


def run_one(repo, mutant):
    """(name, outcome, seconds, pytest's last line) of one mutant applied in repo, then undone."""
    name, path, snippet, replacement, k, _ = mutant
    target = repo / path
    original = target.read_text(encoding="utf-8")
    target.write_text(original.replace(snippet, replacement, 1), encoding="utf-8")
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "test_all.py", "-x", "-q", "-p", "no:cacheprovider",
                            "-k", k], cwd=repo, capture_output=True, text=True)
    finally:
        target.write_text(original, encoding="utf-8")
    outcome = {0: "SURVIVED", 1: "killed", 5: "ERROR (no test selected)"}.get(r.returncode,
                                                                           f"ERROR (pytest exit {r.returncode})")
    return name, outcome, time.perf_counter() - t0, (r.stdout.strip().splitlines() or [""])[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", default="", help="only the mutants whose name holds this (or one of these, comma-separated)")
    p.add_argument("--tests", help="a test_all.py to run instead of this checkout's (e.g. an earlier suite)")
    p.add_argument("-j", type=int, default=1, help="mutants run at a time, each in its own copy")
    p.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = p.parse_args()
    check(MUTANTS)
    chosen = [m for m in MUTANTS if any(k in m[0] for k in args.k.split(","))]
    if args.list:
        for name, path, _, _, k, why in chosen:
            print(f"{name:32} {path:11} {why}  [-k {k}]")
        return
    t0, results = time.perf_counter(), []
    copies = []
    try:
        copies += [copy_repo(args.tests) for _ in range(max(1, args.j))]
        free = list(copies)

        def finish(future):
            results.append(future.result())
            print(f"{results[-1][1]:9} {results[-1][0]:32} {results[-1][2]:4.0f} s  {results[-1][3]}", flush=True)

        with concurrent.futures.ThreadPoolExecutor(len(free)) as pool:
            running = {}
            for mutant in chosen:
                if not free:   # wait for a copy of the repository to be free
                    done = next(concurrent.futures.as_completed(running))
                    free.append(running.pop(done))
                    finish(done)
                repo = free.pop()
                running[pool.submit(run_one, repo, mutant)] = repo
            for done in concurrent.futures.as_completed(running):
                finish(done)
    finally:
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    killed = sum(r[1] == "killed" for r in results)
    print(f"{killed} killed of {len(results)} mutants in {time.perf_counter() - t0:.0f} s"
          + (f" (tests: {args.tests})" if args.tests else ""))
    for name, outcome, _, _ in results:
        if outcome != "killed":
            print(f"not killed: {name}: {outcome}")
    sys.exit(0 if killed == len(results) else 1)


if __name__ == "__main__":
    main()
