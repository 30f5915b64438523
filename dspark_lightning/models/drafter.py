"""DSparkDrafter: the DFlash backbone plus the optional Markov and confidence heads, in one ``nn.Module``.

``forward`` is the training form, ``draft`` the inference form; the decoding modes live in ``selector/`` and
``decoding/``. Design: docs/design/design.md §2 (inference: §2.4), §3.1 and §3.6 (conventions and the teacher)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark_lightning.models.anchors import Anchors, block_visibility, padded_prefix_visibility, sample_anchors
from dspark_lightning.models.attention import resolve_backend
from dspark_lightning.models.backbone import BackboneConfig, DFlashBackbone
from dspark_lightning.models.confidence import ConfidenceHead
from dspark_lightning.models.context_cache import DraftContextCache
from dspark_lightning.models.drafter_config import DrafterConfig
from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.models.sparse_attention import grouped_context
from dspark_lightning.models.target import final_logit_softcap, plain_lookup, rope_theta
from dspark_lightning.models.teacher import TeacherStats, draft_logprobs, expand_rows, full_vocab_teacher
from dspark_lightning.models.vocab import DraftVocab

MARKOV_PREV = ("teacher", "own")


@dataclass
class DrafterOutput:
    """Per block b (row) x a (anchor) x k (slot); N = b*A blocks when flattened."""

    logits: torch.Tensor  # [b, A, B, Vd] base + Markov bias
    base_logits: torch.Tensor  # [b, A, B, Vd]
    hidden: torch.Tensor  # [b, A, B, H]
    confidence_logits: torch.Tensor | None  # [b, A, B]
    # the target's log-probs over the draft vocabulary once per distinct position [U, Vd] (neighbouring blocks
    # overlap), and the row of it each slot reads [b, A, B]: ``teacher_logprobs`` expands them
    teacher_table: torch.Tensor
    teacher_rows: torch.Tensor
    slot_valid: torch.Tensor  # [b, A, B] bool
    prev_tokens: torch.Tensor  # [b, A, B] target ids
    target_tokens: torch.Tensor  # [b, A, B] target ids of the predicted tokens
    anchors: Anchors
    config: DrafterConfig  # of the drafter that produced it: which slots are trained
    # [b, A, B] target ids: the target's argmax over its whole vocabulary, what greedy verification accepts (with a
    # draft vocabulary the argmax of ``teacher_logprobs`` is only the best draft token, which may not be it)
    teacher_argmax: torch.Tensor | None = None

    def trained_slots(self, t: torch.Tensor) -> torch.Tensor:
        """A per-slot tensor of this output [b, A, B, ...] as [N, B', ...]: blocks flattened, trained slots only."""
        return self.config.trained_slots(t.flatten(0, 1))

    @property
    def teacher_logprobs(self) -> torch.Tensor:
        """[b, A, B, Vd] target log-probs of each slot's token (a copy; the loss reads the table row by row)."""
        return expand_rows(self.teacher_table, self.teacher_rows)


class DSparkDrafter(nn.Module):
    """The DSpark drafter: a DFlash backbone predicting a block of tokens per anchor in one pass, reading the frozen
    target's hidden states as extra keys and values, plus the optional Markov and confidence heads
    (docs/design/design.md §2, §4, §5).

    Args:
        config: block size, draft layers, heads and their options (``DrafterConfig``).
        backbone_config: the draft layers' shape, taken from the target (hidden size, heads, rotary base).
        embed_tokens: the target's (frozen) input embedding, shared, never trained.
        lm_head: the target's (frozen) output head, shared; the draft head starts from its draft-vocabulary rows.
        draft_vocab: the reduced output vocabulary (``d2t``/``t2d``), or None for the target's whole vocabulary.
        logit_softcap: the target's final logit soft-cap (``final_logit_softcap(target.config)``), applied to the
            teacher's logits only; the draft logits are the drafter's own.
    """

    def __init__(
        self,
        config: DrafterConfig,
        backbone_config: BackboneConfig,
        embed_tokens: nn.Embedding,
        lm_head: nn.Linear,
        draft_vocab: DraftVocab | None = None,
        logit_softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.logit_softcap = logit_softcap
        vocab_size = embed_tokens.weight.shape[0]
        if config.mask_token_id is None or not 0 <= config.mask_token_id < vocab_size:
            raise ValueError(
                f"mask_token_id must be a token id of the target vocabulary [0, {vocab_size}), "
                f"got {config.mask_token_id} (set it from the tokenizer's mask token)"
            )
        self.verifier_vocab_size = vocab_size
        self.backbone = DFlashBackbone(backbone_config)
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.draft_vocab = draft_vocab
        self.draft_vocab_size = draft_vocab.draft_vocab_size if draft_vocab is not None else vocab_size
        self.draft_lm_head = None
        if draft_vocab is not None and config.train_lm_head:
            self.draft_lm_head = nn.Linear(backbone_config.hidden_size, self.draft_vocab_size, bias=False)
            with torch.no_grad():
                self.draft_lm_head.weight.copy_(lm_head.weight[draft_vocab.d2t])
        hidden = backbone_config.hidden_size
        self.markov_head: MarkovHead | None = (
            config.markov_head.build(vocab_size, self.draft_vocab_size, hidden) if config.markov_head else None
        )
        self.confidence_head: ConfidenceHead | None = None
        if config.confidence_head:
            extra = self.markov_head.config.rank if config.confidence_with_markov else 0
            self.confidence_head = ConfidenceHead(hidden + extra)
        # per-slot temperatures of the confidence logits, fitted after training (see ``calibration.py``); 1 = raw
        self.register_buffer("confidence_temperature", torch.ones(config.block_size))
        embed_tokens.requires_grad_(False)
        lm_head.requires_grad_(False)

    @classmethod
    def for_target(cls, config: DrafterConfig, target, draft_vocab: DraftVocab | None = None) -> DSparkDrafter:
        """Build a drafter shaped after a ``FrozenTarget`` or ``TargetHeads`` (its hidden size, heads, rotary base,
        layers; its input embedding module, LM head and final logit soft-cap)."""
        if config.target_layer_ids is None:  # record which target layers feed this drafter (export needs them)
            config = dataclasses.replace(config, target_layer_ids=list(target.target_layer_ids))
        tc = target.config
        head_dim = config.head_dim or getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        backbone_config = BackboneConfig(
            hidden_size=tc.hidden_size,
            num_layers=config.num_layers,
            num_heads=config.num_heads or tc.num_attention_heads,
            num_kv_heads=config.num_kv_heads or getattr(tc, "num_key_value_heads", tc.num_attention_heads),
            head_dim=head_dim,
            # GPT-2 names it n_inner, and None there means 4 x hidden
            intermediate_size=config.intermediate_size
            or getattr(tc, "intermediate_size", None)
            or getattr(tc, "n_inner", None)
            or 4 * tc.hidden_size,
            rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta(tc),
            num_context_layers=len(target.target_layer_ids),
            attention_backend=config.attention_backend,
            sliding_window=config.sliding_window,
            layer_types=config.layer_types,
        )
        softcap = final_logit_softcap(tc)
        embed = target.embed_tokens if config.block_embedding == "target" else plain_lookup(target.embed_tokens)
        return cls(config, backbone_config, embed, target.lm_head, draft_vocab, softcap)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def d2t(self) -> torch.Tensor | None:
        return self.draft_vocab.d2t if self.draft_vocab is not None else None

    # ------------------------------------------------------------------ shared pieces
    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits U over the draft vocabulary."""
        if self.draft_lm_head is not None:
            return self.draft_lm_head(hidden)
        if self.draft_vocab is not None:
            return F.linear(hidden, self._draft_head_rows())
        return self.lm_head(hidden)

    def _draft_head_rows(self) -> torch.Tensor:
        """The target LM head's rows ``d2t``, gathered once per weight version: the gather copies Vd x H weights
        and costs a decoding step about as much as the head's matmul itself. The head is frozen, so the rows need
        no graph; a copy made in inference mode (decoding) is made again for training, which cannot use it."""
        weight, d2t = self.lm_head.weight, self.draft_vocab.d2t
        key = (weight.data_ptr(), weight._version, d2t.data_ptr(), d2t._version, weight.device, weight.dtype)
        rows = getattr(self, "_head_rows", None)
        if getattr(self, "_head_rows_key", None) != key or (
            rows.is_inference() and not torch.is_inference_mode_enabled()
        ):
            with torch.no_grad():
                rows = weight[d2t]
            self._head_rows, self._head_rows_key = rows, key
        return rows

    def confidence_logits(
        self, hidden: torch.Tensor, prev_tokens: torch.Tensor, prev_embedding: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """``prev_embedding``: W1[prev_tokens] when the caller already looked it up."""
        if self.confidence_head is None:
            return None
        features = hidden
        if self.config.confidence_with_markov:
            if prev_embedding is None:
                prev_embedding = self.markov_head.markov_w1(prev_tokens)
            features = torch.cat((hidden, prev_embedding.to(hidden.dtype)), dim=-1)
        return self.confidence_head(features)

    def _block_embeddings(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[..., ] anchor ids -> embeddings of [x_p, MASK, ..., MASK]: [..., B, H]."""
        B = self.block_size
        tokens = torch.full((*anchor_tokens.shape, B), self.config.mask_token_id, device=anchor_tokens.device)
        tokens[..., 0] = anchor_tokens
        return self.embed_tokens(tokens)

    def _run_backbone(
        self, anchor_tokens, anchor_rotary, context_features, context_positions, visibility, sparse: bool = False
    ):
        """anchor_tokens/anchor_rotary [b, A] -> draft hidden [b, A, B, H]. ``sparse`` (the training forward): with
        a dense mask, each group of blocks attends only to the context stretch it can see, and context positions
        no block sees are not projected (``sparse_attention.py``; exact)."""
        b, A = anchor_tokens.shape
        B = self.block_size
        block = self._block_embeddings(anchor_tokens).flatten(1, 2)
        block_positions = (anchor_rotary[:, :, None] + torch.arange(B, device=block.device)).flatten(1)
        backend = resolve_backend(self.backbone.config.attention_backend, block.device)
        attn_mask = None
        if visibility is not None:
            attn_mask = visibility.build(backend)
            window = self.backbone.config.sliding_window
            if "sliding_attention" in self.backbone.config.layer_types:  # one more mask, for the sliding layers
                sliding = dataclasses.replace(visibility, window=window).build(backend)
                attn_mask = {"full_attention": attn_mask, "sliding_attention": sliding}
            if sparse and backend == "sdpa":
                context_features, context_positions, attn_mask = grouped_context(
                    attn_mask, context_features, context_positions, B
                )
        context = self.backbone.fuse_context(context_features.to(block.dtype))
        hidden = self.backbone(block, context, block_positions, context_positions, attn_mask)
        return hidden.view(b, A, B, -1)

    # ------------------------------------------------------------------ training
    def forward(
        self,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        document_ids: torch.Tensor,
        position_ids: torch.Tensor,
        context_features: torch.Tensor,
        final_hidden: torch.Tensor,
        anchors: Anchors | None = None,
        generator: torch.Generator | None = None,
        markov_prev: str = "teacher",
        teacher_stats: TeacherStats | None = None,
    ) -> DrafterOutput:
        """Teacher-forced training forward over a packed batch (the batch contract: docs/design/data.md §4).

        ``teacher_stats``: the full-vocabulary logsumexp and argmax per position of ``final_hidden`` (from a feature
        cache): the teacher then evaluates the LM head on the draft rows only (docs/design/design.md §3.6).

        ``markov_prev``: what the Markov head reads as each slot's previous token: ``teacher`` (the text, as
        trained) or ``own`` (the drafter's own greedy choice at the slot before, a sequential decode inside the
        forward: what greedy ``markov`` decoding does; ``prev_tokens`` then holds those choices).
        """
        if markov_prev not in MARKOV_PREV:
            raise ValueError(f"unknown markov_prev {markov_prev!r}; expected one of {MARKOV_PREV}")
        cfg = self.config
        B, S = cfg.block_size, input_ids.shape[1]
        if anchors is None:
            anchors = sample_anchors(loss_mask, document_ids, B, cfg.max_anchors, cfg.sample_from_anchor, generator)
        p = anchors.positions  # [b, A]
        offsets = torch.arange(B, device=p.device)
        shift = 1 if cfg.sample_from_anchor else 0
        predicted = (p[:, :, None] + offsets + shift).clamp(max=S - 1)  # [b, A, B]
        gather = lambda t, idx: t.gather(1, idx.flatten(1)).view(idx.shape)  # noqa: E731
        target_tokens = gather(input_ids, predicted)
        prev_tokens = gather(input_ids, (predicted - 1).clamp(min=0))
        slot_valid = anchors.valid[:, :, None] & gather(loss_mask.bool(), predicted)
        cfg.untrained_slots(slot_valid, dim=2).fill_(False)  # the DFlash bonus slot is never trained

        anchor_tokens = input_ids.gather(1, p)
        anchor_rotary = position_ids.gather(1, p)
        visibility = block_visibility(anchors, document_ids, B)
        hidden = self._run_backbone(
            anchor_tokens, anchor_rotary, context_features, position_ids, visibility, sparse=True
        )

        base_logits = self.output_logits(hidden)
        logits, prev_embedding = base_logits, None
        if self.markov_head is not None:
            trained = lambda t: cfg.trained_slots(t, dim=2)  # noqa: E731
            if markov_prev == "own":
                prev_tokens = prev_tokens.clone()
                trained(prev_tokens).copy_(
                    self._own_previous(trained(base_logits), trained(hidden), trained(prev_tokens)[:, :, 0])
                )
            # W1[prev] looked up once for the head and the confidence features: one dense gradient of W1, not two
            prev_embedding = self.markov_head.markov_w1(prev_tokens)
            # the head starts at the first drafted slot, as decoding does: in the DFlash convention slot 0 (the
            # bonus token) is never drafted, so it must not advance the rnn head's state either
            drafted = self.markov_head.add_block_bias(
                trained(base_logits).flatten(0, 1),
                trained(prev_tokens).flatten(0, 1),
                trained(hidden).flatten(0, 1),
                trained(prev_embedding).flatten(0, 1),
            ).view(trained(base_logits).shape)
            untrained = cfg.untrained_slots(base_logits, dim=2)  # the DFlash bonus slot: never drafted
            logits = torch.cat((untrained, drafted), dim=2) if untrained.shape[2] else drafted
        table, rows, teacher_argmax = self.teacher_table(final_hidden, (predicted - 1).clamp(min=0), teacher_stats)
        return DrafterOutput(
            logits=logits,
            base_logits=base_logits,
            hidden=hidden,
            confidence_logits=self.confidence_logits(hidden, prev_tokens, prev_embedding),
            teacher_table=table,
            teacher_rows=rows,
            slot_valid=slot_valid,
            prev_tokens=prev_tokens,
            target_tokens=target_tokens,
            anchors=anchors,
            config=cfg,
            teacher_argmax=teacher_argmax,
        )

    @torch.no_grad()
    def _own_previous(self, base_logits: torch.Tensor, hidden: torch.Tensor, first_prev: torch.Tensor) -> torch.Tensor:
        """Greedy sequential Markov decode of blocks [b, A, B', Vd] -> each slot's previous token [b, A, B']
        (target ids): ``first_prev`` for the first slot, then the drafter's own choice at the slot before."""
        head, shape = self.markov_head, base_logits.shape
        prev, state = first_prev.flatten(), None
        previous = []
        for slot in range(shape[2]):
            previous.append(prev)
            bias, state = head.step_bias(prev, hidden[:, :, slot].flatten(0, 1), state)
            choice = (base_logits[:, :, slot].flatten(0, 1) + bias.to(base_logits.dtype)).argmax(-1)
            prev = choice if self.d2t is None else self.d2t[choice]
        return torch.stack(previous, dim=-1).view(shape[:3])

    @torch.no_grad()
    def teacher_logprobs(
        self, final_hidden: torch.Tensor, positions: torch.Tensor, stats: TeacherStats | None = None
    ) -> torch.Tensor:
        """Target log-probs of the next token after each of ``positions`` [b, ...], over the draft vocab."""
        return self.teacher(final_hidden, positions, stats)[0]

    @torch.no_grad()
    def teacher(
        self, final_hidden: torch.Tensor, positions: torch.Tensor, stats: TeacherStats | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``teacher_logprobs`` [b, ..., Vd], the target's full-vocabulary argmax as target ids [b, ...]) after
        ``positions``: :meth:`teacher_table` expanded to one row per position."""
        table, rows, argmax = self.teacher_table(final_hidden, positions, stats)
        return expand_rows(table, rows), argmax

    @torch.no_grad()
    def teacher_table(
        self, final_hidden: torch.Tensor, positions: torch.Tensor, stats: TeacherStats | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the target's log-probs over the draft vocab at each distinct position of ``positions`` [U, Vd], the row of
        that table each position reads [b, ...], the target's full-vocabulary argmax as target ids [b, ...]).

        With ``stats`` (per position of ``final_hidden``: the full-vocabulary logsumexp and argmax, as a feature
        cache stores them) the LM head runs over the draft rows only; without, over the whole vocabulary at the
        distinct positions (docs/design/design.md §3.6). Both give log_softmax(lm_head(h))[d2t] and its full argmax.
        """
        b, S, H = final_hidden.shape
        flat = (positions.reshape(b, -1) + S * torch.arange(b, device=positions.device)[:, None]).reshape(-1)
        unique, inverse = torch.unique(flat, return_inverse=True)  # each position once: neighbouring blocks overlap
        rows = final_hidden.reshape(b * S, H)[unique]
        if stats is not None:
            logsumexp, argmax = stats.take(unique)
            head = self._draft_head_rows() if self.draft_vocab is not None else self.lm_head.weight
            logprobs = draft_logprobs(rows, head, logsumexp, self.logit_softcap)
        else:
            logprobs, argmax = full_vocab_teacher(rows, self.lm_head.weight, self.d2t, softcap=self.logit_softcap)
        return logprobs, inverse.view(positions.shape), argmax[inverse].view(positions.shape)

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def draft(
        self,
        context_features: torch.Tensor,
        context_positions: torch.Tensor,
        anchor_tokens: torch.Tensor,
        anchor_positions: torch.Tensor,
        context_valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block per row after a prefix.

        Args:
            context_features: target features of the prefix [b, S, n*H] (every prefix token before the anchor).
            context_positions: rotary positions of the prefix [b, S].
            anchor_tokens: the newest token of each row [b] (the block's slot 0).
            anchor_positions: its rotary position [b].
            context_valid: [b, S] bool, False on (left) padding; None = all valid.
        Returns:
            base logits [b, B, Vd] and draft hidden states [b, B, H].
        """
        visibility = None
        if context_valid is not None and not bool(context_valid.all()):
            visibility = padded_prefix_visibility(context_valid, self.block_size)
        hidden = self._run_backbone(
            anchor_tokens[:, None], anchor_positions[:, None], context_features, context_positions, visibility
        )[:, 0]
        return self.output_logits(hidden), hidden

    def new_context_cache(self, batch: int = 1, device=None, capacity: int = 256) -> DraftContextCache:
        """An empty ``DraftContextCache`` for ``draft_cached``; fill it with ``cache.extend(target_features)``."""
        weight = self.backbone.fc.weight
        return DraftContextCache(
            self.backbone, batch, device or weight.device, self.embed_tokens.weight.dtype, capacity=capacity
        )

    @torch.no_grad()
    def draft_cached(
        self, cache: DraftContextCache, anchor_tokens: torch.Tensor, anchor_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``draft`` after the prefix held in ``cache`` (every row fully valid): base logits [b, B, Vd], hidden [b, B, H].

        Equals ``draft(features, arange(S), anchor_tokens, anchor_positions)`` for the features the cache was
        extended with, without re-projecting them.
        """
        B = self.block_size
        block = self._block_embeddings(anchor_tokens[:, None]).flatten(1, 2)
        block_positions = anchor_positions[:, None] + torch.arange(B, device=block.device)
        hidden = self.backbone(block, None, block_positions, None, None, context_cache=cache)
        return self.output_logits(hidden), hidden
