"""The table of ``scripts/mutation_audit.py``: one realistic bug per entry, and the fast unit tests that cover it.

``old`` must occur exactly once in ``file`` (the audit refuses to run otherwise). ``harmless`` says, for a mutation
no test catches, why that is acceptable (an equivalent mutant); it is empty for every mutation a test must catch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    old: str
    new: str
    what: str
    tests: tuple[str, ...]
    harmless: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


D = "dspark_lightning/"
VERIFY = ("tests/unit/decoding/test_verify.py",)
STATS = ("tests/unit/decoding/test_stats.py", "tests/unit/measuring/test_eval_report.py")
INTERVALS = ("tests/unit/measuring/test_intervals.py", "tests/unit/measuring/test_eval_report.py")
WEIGHTS = ("tests/unit/losses/test_loss_weights.py", "tests/unit/losses/test_losses.py")
LOSSES = ("tests/unit/losses/test_masked_rows.py", "tests/unit/losses/test_losses.py")
TEACHER = ("tests/unit/models/test_teacher.py",)
SLIDING = (
    "tests/unit/decoding/test_sliding_window_target.py::test_sliding_layers_hold_only_the_window",
    "tests/unit/decoding/test_sliding_window_target.py::test_greedy_output_equals_generate_across_the_window",
)
GREEDY = (  # the bigram target of test_decoding ignores its cache: a real attention target checks the rollback too
    "tests/unit/decoding/test_decoding.py::test_greedy_output_equals_target_generate",
    "tests/unit/decoding/test_sliding_window_target.py::test_greedy_output_equals_generate_across_the_window",
)
CONTEXT = ("tests/unit/decoding/test_decoding_cache.py",)
EXPORT = ("tests/unit/interop/test_export_fields.py", "tests/unit/interop/test_vllm_fields.py")
SEEDS = ("tests/unit/lightning/test_anchor_seeds.py",)
SPLITS = (
    "tests/unit/data/test_splits.py",
    "tests/unit/data/test_data_datamodule.py::test_split_by_id_carves_disjoint_splits_out_of_one_source",
)
PROMPTS = ("tests/unit/data/test_prompts.py", "tests/unit/measuring/test_eval_sets.py")
CACHE_INDEX = ("tests/unit/data/test_cache_index.py",)
RANKS = ("tests/unit/data/test_splits.py",)
ANCHORS = ("tests/unit/models/test_anchors.py",)
PREFLIGHT = ("tests/unit/data/test_preflight.py", "tests/unit/data/test_completion.py")
REPLAY = ("tests/unit/models/test_error_replay.py", "tests/unit/lightning/test_recipe_choice_options.py")

M = Mutation
MUTATIONS = [
    # the verify rule (decoding/verify.py)
    M("verify-d2t-placement", D + "decoding/verify.py", "q_target[d2t] = q[i]", "q_target[: q.shape[-1]] = q[i]",
      "draft probabilities placed at ids 0..Vd-1 instead of their d2t target ids", VERIFY),
    M("verify-ratio-swapped", D + "decoding/verify.py", "ratio = p[token] / q_target[token].clamp_min(1e-30)",
      "ratio = q_target[token] / p[token].clamp_min(1e-30)", "acceptance ratio q/p instead of p/q", VERIFY),
    M("verify-residual-unclamped", D + "decoding/verify.py", "residual = (p - q_target).clamp_min(0)",
      "residual = (p - q_target).abs()", "residual |p - q| instead of (p - q)+", VERIFY),
    M("verify-no-temperature", D + "decoding/verify.py",
      "p = torch.softmax(at_least_float32(logits[i]) / temperature, dim=-1)",
      "p = torch.softmax(at_least_float32(logits[i]), dim=-1)", "the target law of a slot ignores the temperature",
      VERIFY),
    M("verify-bonus-row", D + "decoding/verify.py", "p = torch.softmax(at_least_float32(logits[n]) / temperature, dim=-1)",
      "p = torch.softmax(at_least_float32(logits[n - 1]) / temperature, dim=-1)",
      "the bonus token after a fully accepted block is drawn from the previous row (off by one)", VERIFY),
    M("verify-bf16-probabilities", D + "dtypes.py",
      "return x.to(torch.promote_types(x.dtype, torch.float32))", "return x",
      "the target's p, its own draw and the draft's q computed in bf16 for a bf16 model: p / q rounded", VERIFY),
    M("walk-bf16-q", D + "selector/walks.py",
      "torch.softmax(at_least_float32(row_logits) / temperature, dim=-1)",
      "torch.softmax(row_logits / temperature, dim=-1)",
      "a bf16 drafter's q computed in bf16: the draft samples from one law, verification divides by another",
      ("tests/unit/selector/test_selector.py",)),
    M("verify-greedy-bonus-row", D + "decoding/verify.py", "return n, int(logits[n].argmax())",
      "return n, int(logits[n - 1].argmax())", "greedy bonus token read from the previous row", VERIFY),
    M("verify-greedy-count", D + "decoding/verify.py", "                return i, token",
      "                return i + 1, token", "greedy counts the rejected draft as accepted", VERIFY),
    # acceptance and tau counting (decoding/stats.py, measuring/eval_set_summary.py)
    M("stats-slot-denominator", D + "decoding/stats.py",
      "tried = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a >= slot)",
      "tried = sum(1 for v in self.verified_per_step if v > slot)",
      "per-slot rate divided by every step that verified the slot, not by the steps that reached it", STATS),
    M("stats-slot-accepted-boundary", D + "decoding/stats.py",
      "ok = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a > slot)",
      "ok = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a >= slot)",
      "slot counted accepted when only the slots before it were (a > k vs a >= k)", STATS),
    M("stats-tau-accepted", D + "decoding/stats.py", "return sum(self.emitted_per_step) / self.target_forwards",
      "return sum(self.accepted_per_step) / self.target_forwards",
      "tau counts accepted drafts, not emitted tokens (the bonus token dropped)", STATS),
    M("stats-record-slots", D + "decoding/stats.py",
      "accepted_per_slot=[sum(1 for a in stats.accepted_per_step if a > slot) for slot in range(longest)]",
      "accepted_per_slot=[sum(1 for a in stats.accepted_per_step if a >= slot) for slot in range(longest)]",
      "a prompt's per-slot counts off by one (a >= k)", STATS),
    M("stats-merge-last-only", D + "decoding/stats.py", "merged.emitted_per_step += run.emitted_per_step",
      "merged.emitted_per_step = run.emitted_per_step", "merging keeps only the last run's emitted tokens", STATS),
    M("summary-slot-per-prompt", D + "measuring/eval_set_summary.py", "return [count / forwards for count in accepted]",
      "return [count / len(records) for count in accepted]",
      "set acceptance per slot divided by prompts instead of verification steps", STATS),
    M("summary-tau-swapped", D + "measuring/eval_set_summary.py", "measured_tau=_json_float(ratio_of_sums(emitted, forwards))",
      "measured_tau=_json_float(ratio_of_sums(forwards, emitted))", "measured tau inverted (swapped ratio)", STATS),
    M("summary-speedup-swapped", D + "measuring/eval_set_summary.py",
      "speedup = _json_float(ratio_of_sums(baseline, speculative))",
      "speedup = _json_float(ratio_of_sums(speculative, baseline))", "speedup inverted (swapped ratio)", STATS),
    # intervals (measuring/intervals.py)
    M("interval-one-sided-tail", D + "measuring/intervals.py", "tail = (1 - confidence) / 2", "tail = 1 - confidence",
      "a 95% interval cut at the 5% and 95% quantiles (90% coverage)", INTERVALS),
    M("interval-unpaired", D + "measuring/intervals.py",
      "numerator[rows].sum(axis=1) / denominator[rows].sum(axis=1)\n",
      "numerator[rows].sum(axis=1) / denominator[rows[::-1]].sum(axis=1)\n",
      "ratio bootstrap resamples numerators and denominators with different draws (pairs broken)", INTERVALS),
    M("interval-mean-of-ratios", D + "measuring/intervals.py", "return float(numerator.sum() / denominator.sum())",
      "return float((numerator / denominator).mean())", "pooled ratio replaced by a mean of per-prompt ratios",
      INTERVALS),
    M("interval-last-prompt-never-drawn", D + "measuring/intervals.py",
      "generator.integers(0, size, size=", "generator.integers(0, size - 1, size=",
      "bootstrap indices exclude the last prompt (off by one)", INTERVALS),
    M("interval-difference-denominator", D + "measuring/intervals.py",
      "- num_b[rows].sum(axis=1) / den_b[rows].sum(axis=1)", "- num_b[rows].sum(axis=1) / den_a[rows].sum(axis=1)",
      "paired difference divides b by a's denominators (stale variable)", INTERVALS),
    # losses and weights (losses/)
    M("weights-exp-off-by-one", D + "losses/position_weighting.py", "w = torch.exp(-k / gamma) if sample_from_anchor",
      "w = torch.exp(-(k + 1) / gamma) if sample_from_anchor", "exp position weights start at exp(-1/gamma)", WEIGHTS),
    M("weights-bonus-slot-unmasked", D + "losses/position_weighting.py",
      "    if not sample_from_anchor:\n        w[0] = 0.0", "    if False:\n        w[0] = 0.0",
      "DFlash form: the untrained bonus slot 0 keeps a weight (dropped mask)", WEIGHTS),
    M("dpace-prefix-not-suffix", D + "losses/position_weighting.py",
      "w = prefix.flip(-1).cumsum(-1).flip(-1) * trained", "w = prefix.cumsum(-1) * trained",
      "D-PACE weights as prefix sums instead of suffix sums", WEIGHTS),
    M("dpace-smoothing-swapped", D + "losses/position_weighting.py",
      "a = (1.0 - smoothing) * alpha.detach() + smoothing", "a = smoothing * alpha.detach() + (1.0 - smoothing)",
      "D-PACE smoothing lambda and 1 - lambda swapped", WEIGHTS),
    M("dpace-untrained-zero", D + "losses/position_weighting.py", "a = torch.where(trained, a, torch.ones_like(a))",
      "a = torch.where(trained, a, torch.zeros_like(a))", "untrained slots zero the products after them", WEIGHTS),
    M("loss-alpha-max", D + "losses/terms.py", "    alpha = torch.minimum(p, q).sum(-1)\n    values[1]",
      "    alpha = torch.maximum(p, q).sum(-1)\n    values[1]", "acceptance sum of max(p, q) instead of min", LOSSES),
    M("loss-ce-draft-argmax", D + "losses/terms.py", "values[2] = -logq.gather(-1, t[:, None]).squeeze(-1)",
      "values[2] = -logq.gather(-1, d_arg[:, None]).squeeze(-1)",
      "cross-entropy against the draft's own argmax, not the teacher's", LOSSES),
    M("loss-lk-lambda", D + "losses/terms.py", "lam = torch.exp(-lk_eta * alpha) if",
      "lam = torch.exp(-lk_eta * (1.0 - alpha)) if", "LK hybrid weight grows with alpha instead of shrinking",
      LOSSES),
    M("loss-mean-unweighted-denominator", D + "losses/compound.py", "        denom = eff_w.sum()\n",
      "        denom = (eff_w > 0).sum()\n", "weighted mean divided by the number of rows, not the weight sum", LOSSES),
    M("loss-mask-dropped", D + "losses/compound.py", "        valid = eff_w > 0\n",
      "        valid = eff_w >= 0\n", "rows outside the loss no longer masked (NaN rows leak in)", LOSSES),
    # the teacher (models/teacher.py)
    M("teacher-tie-later-tile", D + "models/teacher.py", "better = tile_top > top", "better = tile_top >= top",
      "an equal maximum in a later vocabulary tile wins the argmax", TEACHER),
    M("teacher-no-rescale", D + "models/teacher.py", "total = total * (top - new_top).exp() + ",
      "total = total + ", "the running logsumexp is not rescaled when the maximum moves", TEACHER),
    M("teacher-argmax-offset", D + "models/teacher.py", "torch.where(better, tile_arg + v0, argmax[r0:r1])",
      "torch.where(better, tile_arg, argmax[r0:r1])", "a later tile's argmax lacks its vocabulary offset", TEACHER),
    M("teacher-gather-first-tile", D + "models/teacher.py", "lo, hi = bounds[tile], bounds[tile + 1]",
      "lo, hi = bounds[0], bounds[1]", "every vocabulary tile gathers the first tile's draft columns", TEACHER),
    M("teacher-softcap-dropped", D + "models/teacher.py",
      "logits = soft_cap(F.linear(block, weight[v0 : v0 + tile_vocab]).to(cd), softcap)",
      "logits = soft_cap(F.linear(block, weight[v0 : v0 + tile_vocab]).to(cd), None)",
      "the final logit softcap (Gemma 2) ignored by the teacher", TEACHER),
    # caches and rollback (decoding/target_cache.py, decoding/loop.py)
    M("cache-trim-only-on-rejection", D + "decoding/target_cache.py", "if surplus > 0 or self.rollback:",
      "if surplus > 0:", "sliding layers trimmed only when a draft was rejected (unbounded memory)", SLIDING),
    M("cache-crop-off-by-one", D + "decoding/target_cache.py", "surplus = self.length() - length\n",
      "surplus = self.length() - length + 1\n", "crop removes one token too many", SLIDING),
    M("cache-no-rollback-mode", D + "decoding/target_cache.py",
      "            self.cache.activate_past_recording(", "            (lambda **_: None)(",
      "sliding layers never switched to rollback mode (a rejection leaves a hole in the window)", SLIDING),
    M("loop-commit-length", D + "decoding/loop.py", "length = self.length + 1 + accepted",
      "length = self.length + accepted", "the target's cache cropped without the anchor token", GREEDY),
    M("loop-context-off-by-one", D + "decoding/loop.py", "kept = features[:, : 1 + accepted]",
      "kept = features[:, :accepted]", "the drafter's context misses the anchor's features", CONTEXT),
    M("loop-eos-dropped", D + "decoding/loop.py", "tokens = tokens[: i + 1]", "tokens = tokens[:i]",
      "the output is cut before the EOS token instead of after it", GREEDY),
    # export fields (interop/)
    M("export-causal-flag", D + "interop/speculators_format.py", '"is_causal": False,', '"is_causal": True,',
      "the export's draft layers declared causal (vLLM would mask within a block)", EXPORT),
    M("export-speculative-tokens", D + "interop/speculators_format.py",
      '"speculative_tokens": block if cfg.sample_from_anchor else block - 1', '"speculative_tokens": block',
      "DFlash form: the bonus slot counted as a speculative token", EXPORT),
    M("export-vocab-size", D + "interop/speculators_format.py", '"vocab_size": drafter.verifier_vocab_size',
      '"vocab_size": drafter.draft_vocab_size', "the layer config's vocabulary is the draft one", EXPORT),
    M("export-sliding-window", D + "interop/speculators_format.py",
      '        layer_config["sliding_window"] = bc.sliding_window', "        pass",
      "a sliding-window drafter exported without its window", EXPORT),
    M("export-d2t-absolute", D + "interop/export.py",
      'tensors["d2t"] = vocab.d2t - torch.arange(vocab.draft_vocab_size, device=vocab.d2t.device)',
      'tensors["d2t"] = vocab.d2t', "d2t exported as absolute ids where the format holds offsets", EXPORT),
    M("export-lm-head-first-rows", D + "interop/export.py", "drafter.lm_head.weight[vocab.d2t]",
      "drafter.lm_head.weight[: vocab.draft_vocab_size]",
      "the draft head exported as the first Vd rows of the target head, not the d2t rows", EXPORT),
    # seeds (lightning/module.py)
    M("seed-rank-ignored", D + "lightning/module.py",
      "seed = stream_seed(self.training_args.seed, self.global_step, self.global_rank)",
      "seed = stream_seed(self.training_args.seed, self.global_step, 0)",
      "every rank draws the same anchors", SEEDS),
    M("seed-step-ignored", D + "lightning/module.py", 'f"{seed},{step},{rank}".encode()',
      'f"{seed},{rank}".encode()', "the anchor seed ignores the step (the same anchors every step)", SEEDS),
    # data selection and splits (data/)
    M("split-test-threshold", D + "data/splits.py", 'else "test" if u < self.validation + self.test else',
      'else "test" if u < self.test else', "the test split's threshold forgets the validation offset", SPLITS),
    M("split-parts-not-grouped", D + "data/splits.py",
      'group = _PART_SUFFIX.sub("", identifier.split("#", 1)[0])', 'group = identifier.split("#", 1)[0]',
      "parts <id>_0, <id>_1 of one conversation hashed apart (leak into validation)", SPLITS),
    M("split-part-suffix-one-digit", D + "data/splits.py", 're.compile(r"_\\d+$")', 're.compile(r"_\\d$")',
      "only single-digit part suffixes grouped (<id>_10 leaks)", SPLITS),
    M("split-rank-uneven", D + "data/cache.py",
      "stop = (num_samples // world_size) * world_size if even else num_samples", "stop = num_samples",
      "ranks read unequal sample counts (a DDP hang at the epoch's end)", RANKS),
    M("split-rank-same-start", D + "data/cache.py", "return range(rank, stop, world_size)",
      "return range(0, stop, world_size)", "every rank reads rank 0's samples", SPLITS),
    M("cache-index-stale-key", D + "data/cache.py", 'keys = ("target_layer_ids", "hidden_size", "seq_len", "dtype")',
      'keys = ("hidden_size", "seq_len", "dtype")',
      "caches of different target layers read together (a key missing from the check)", CACHE_INDEX),
    M("cache-shuffle-epoch-ignored", D + "data/cache.py", "manual_seed(self.seed * 1_000_003 + self.epoch)",
      "manual_seed(self.seed)", "the cached dataset's shuffle seed ignores the epoch (one order for every epoch)",
      CACHE_INDEX),
    M("cache-only-first-directory", D + "data/cache.py",
      "[loc for index in self.indexes for loc in index.locate()]",
      "[loc for index in self.indexes[:1] for loc in index.locate()]",
      "only the first of several cache directories is read", CACHE_INDEX),
    M("prompts-test-split-leaks", D + "data/prompts.py", 'id_split.split_of(example.record_id) != "validation"',
      'id_split.split_of(example.record_id) == "train"', "held-out prompts also drawn from the test split",
      PROMPTS),
    M("prompts-length-boundary", D + "data/prompts.py", "len(prompt_ids) < seq_len", "len(prompt_ids) <= seq_len",
      "an evaluation prompt as long as seq_len is kept (no room for the first new token)", PROMPTS),
    M("anchor-padding-valid", D + "models/anchors.py", "valid = loss_mask.bool() & (document_ids >= 0)",
      "valid = loss_mask.bool()", "padding positions can be anchors (dropped mask)", ANCHORS),
    M("anchor-block-crosses-document", D + "models/anchors.py",
      "document_ids[:, : S - last_offset] == document_ids[:, last_offset:]",
      "document_ids[:, : S - last_offset] == document_ids[:, last_offset - 1 : S - 1]",
      "a block may run one token into the next document (off by one)", ANCHORS),
    # preflight (data/preflight.py)
    M("preflight-first-file-only", D + "data/preflight.py", "    for path in files:\n", "    for path in files[:1]:\n",
      "only the first file of a split is sampled", PREFLIGHT),
    M("preflight-empty-is-unusable", D + "data/preflight.py", "if good == 0 and reasons]", "if good == 0]",
      "a file with no records counts as unusable (a split of empty and bad files passes)", PREFLIGHT),
    # draft-induced states (models/error_replay.py, lightning/module.py, lightning/frozen_state.py)
    M("replay-off-by-one", D + "models/error_replay.py", "positions = predicted.gather(2, first).squeeze(2)",
      "positions = predicted.gather(2, first).squeeze(2) + 1",
      "replayed anchors one token after the rejection (a decode anchors at the rejected position itself)", REPLAY),
    M("replay-dflash-offset", D + "models/error_replay.py",
      "predicted = out.anchors.positions[:, :, None] + offsets",
      "predicted = out.anchors.positions[:, :, None] + offsets + int(not cfg.sample_from_anchor)",
      "in the DFlash convention (slot k predicts p + k) the rejected position is read one token late", REPLAY),
    M("replay-scan-runs-past-text", D + "models/error_replay.py", "stop = rejected | ~supervised", "stop = rejected",
      "a rejection counted past the end of the supervised text (where no decode drafts)", REPLAY),
    M("replay-row-count-grows", D + "models/error_replay.py",
      "keep_chosen = (chosen_scores >= 0) & (rank < count)", "keep_chosen = chosen_scores >= 0",
      "a row with fewer anchors is filled up to the widest row's count (the step's cost changes)", REPLAY),
    M("replay-probe-reads-text", D + "lightning/module.py",
      'probe = self.draft(batch, context_features, final_hidden, anchors, "own", stats)',
      'probe = self.draft(batch, context_features, final_hidden, anchors, "teacher", stats)',
      "the probe's Markov head reads the text, not its own choices (other rejections than decoding's)", REPLAY),
    M("markov-prev-option-ignored", D + "lightning/module.py",
      "anchors, markov_prev = self.training_anchors(batch, generator), self.training_args.markov_prev",
      'anchors, markov_prev = self.training_anchors(batch, generator), "teacher"',
      "training.markov_prev: own is ignored (the Markov head trains on the text)", REPLAY),
    M("init-weights-not-loaded", D + "lightning/frozen_state.py",
      "self.load_state_dict(trainable, strict=False)", "pass",
      "training.init_weights is checked but never loaded (the stage starts from scratch)", REPLAY),
]  # fmt: skip
