"""``ShareGPTDataModule``: streamed, shuffled, sharded, tokenised and packed conversations or completion records.

Streaming, sharding, counting and resuming: docs/design/data.md §5; the data format: §1.5; cached splits: §6.2."""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Literal

import lightning as L
import torch
from datasets.distributed import split_dataset_by_node
from jsonargparse.typing import NonNegativeInt, PositiveInt
from transformers import AutoTokenizer

from dspark_lightning.data.accounting import CountingDataLoader, SharedCounts
from dspark_lightning.data.cache import CachedFeatureDataset, CachedFeatureLoader
from dspark_lightning.data.completion import Completion, CompletionEncoder
from dspark_lightning.data.files import DEFAULT_MAX_RECORD_BYTES
from dspark_lightning.data.formats import FormatChoice, choose_format, make_encoder
from dspark_lightning.data.preflight import preflight_data_files
from dspark_lightning.data.prompts import choose_eval_conversations
from dspark_lightning.data.reports import DataReports
from dspark_lightning.data.sharegpt import Conversation, DataSource, IdSplit, iter_conversations, resolve_source
from dspark_lightning.data.stream import PackedConversationStream, open_record_stream, raw_record_from_example
from dspark_lightning.data.tokenize import ConversationEncoder, resolve_mask_token, resolve_pad_token_id
from dspark_lightning.errors import OptionError, loading
from dspark_lightning.shipped import local_or_shipped

logger = logging.getLogger(__name__)


class ShareGPTDataModule(DataReports, L.LightningDataModule):
    """Streams ShareGPT / OpenAI-style conversations (or completion records) into packed, loss-masked rows.

    Streaming, sharding, counting and resuming: docs/design/data.md §5; the batches it yields: §4. The arguments are
    documented on ``__init__``.
    """

    def __init__(
        self,
        tokenizer: str,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        test_files: str | list[str] | None = None,
        seq_len: PositiveInt = 512,
        batch_size: PositiveInt = 4,
        num_workers: NonNegativeInt = 0,
        shuffle_buffer: NonNegativeInt = 1000,
        seed: int = 0,
        on_bad_record: Literal["skip", "raise"] = "skip",
        max_length: PositiveInt | None = None,
        min_supervised_tokens: NonNegativeInt = 1,
        num_eval_prompts: NonNegativeInt = 8,
        block_size: NonNegativeInt = 8,
        trust_remote_code: bool = False,
        limit_val_samples: NonNegativeInt | None = None,
        mask_token: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        train_cache: str | list[str] | None = None,
        val_cache: str | list[str] | None = None,
        split_by_id: dict[str, float] | None = None,
        max_record_bytes: PositiveInt = DEFAULT_MAX_RECORD_BYTES,
        format: Literal["auto", "chat", "completion"] = "auto",
    ):
        """
        Args:
            tokenizer: Path or hub id of the target's tokenizer (its chat template renders the conversations).
            train_files: Training conversations: local ``.json``/``.jsonl`` files, directories or globs (or a list of
                them), or a Hugging Face dataset id ``owner/name[:config]:split`` (default split ``train``).
            val_files: Validation conversations, same forms (default split for a hub id: ``validation``).
            test_files: Test conversations for ``dspark-lightning test``, same forms (default: ``val_files``).
            seq_len: Tokens per packed row; every row is padded to exactly this length.
            batch_size: Packed rows per batch.
            num_workers: DataLoader worker processes (at most the number of shards do work).
            shuffle_buffer: Records held in the training shuffle buffer (0 disables shuffling entirely).
            seed: Seed of the shard-order and buffer shuffles (combined with the epoch).
            on_bad_record: ``"skip"`` unusable records and count them by reason, or ``"raise"`` naming file and line.
            max_length: Truncate each conversation to this many tokens (``seq_len`` always applies as well).
            min_supervised_tokens: Skip conversations with fewer assistant tokens than this (after truncation).
            num_eval_prompts: How many validation prompts ``eval_prompts()`` returns.
            block_size: Draft block size; conversations where no assistant token leaves room for a whole block are
                skipped (reason ``no_anchor_room``). 0 disables the check.
            trust_remote_code: Allow custom code for the tokenizer (``datasets`` no longer runs dataset scripts).
            limit_val_samples: Use only the first this many validation records (in file order).
            mask_token: Token to use as the drafter's mask token when the tokenizer defines none; must already be in
                the vocabulary (e.g. an unused reserved token).
            chat_template_kwargs: Extra variables for the chat template (e.g. ``{"enable_thinking": false}``).
            train_cache: Directory (or list) written by ``dspark-lightning cache``: train from cached target features
                instead of ``train_files`` (pair with ``model.target.features: cache``).
            val_cache: Same for validation and test (instead of ``val_files`` / ``test_files``).
            split_by_id: Carve validation / test out of the same files by conversation id, e.g.
                ``{validation: 0.02, test: 0.02}`` (deterministic; all parts ``<id>_N`` of one conversation stay
                together). Each split keeps only its own records; ``val_files`` / ``test_files`` default to
                ``train_files``. Counted as ``other_split_records``, never as bad records.
            max_record_bytes: Records larger than this are skipped (reason ``record_too_large``) before they are
                parsed; a JSON Lines line over it is never held in memory whole.
            format: ``chat``: conversations rendered with the tokenizer's chat template, assistant tokens supervised;
                ``completion``: records ``{"prompt", "completion"}`` tokenised as plain text, completion tokens
                supervised (base models without a chat template); ``auto``: completion for completion records, chat
                for conversations when the tokenizer has a chat template, and an error (never an invented template)
                when it has none (docs/design/data.md §1.5). The choice is logged and saved as the run's data_format.json.
        """
        super().__init__()
        self.save_hyperparameters()
        self.tokenizer_name = tokenizer
        self.train_files, self.val_files, self.test_files = train_files, val_files, test_files
        self._resume: dict[str, int] | None = None
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.shuffle_buffer, self.seed, self.on_bad_record = shuffle_buffer, seed, on_bad_record
        self.max_length, self.min_supervised_tokens = max_length, min_supervised_tokens
        self.num_eval_prompts, self.block_size = num_eval_prompts, block_size
        self.trust_remote_code, self.limit_val_samples = trust_remote_code, limit_val_samples
        self.mask_token, self.chat_template_kwargs = mask_token, chat_template_kwargs
        self.train_cache, self.val_cache = train_cache, val_cache
        self.id_split = IdSplit.from_fractions(split_by_id)
        if on_bad_record not in ("skip", "raise"):
            raise OptionError(f"data.on_bad_record must be 'skip' or 'raise', got {on_bad_record!r}")
        sizes = dict(seq_len=seq_len, batch_size=batch_size, max_record_bytes=max_record_bytes)  # at least 1
        for name, value in (sizes | dict(num_workers=num_workers, shuffle_buffer=shuffle_buffer)).items():
            least = 1 if name in sizes else 0  # the CLI's types refuse these at parse time; this is for Python callers
            if value < least:
                raise OptionError(f"data.{name} must be at least {least}, got {value}")
        self.max_record_bytes = max_record_bytes
        self.format = format
        self._format_choice: FormatChoice | None = None
        self._warned_skips: set[str] = set()
        self._tokenizer = None
        self._encoder: ConversationEncoder | CompletionEncoder | None = None
        self._counts: dict[str, SharedCounts] = {}
        self._eval_conversations: list[Conversation] | list[Completion] | None = None

    # ----------------------------------------------------------------------------------------------- tokenizer
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            name = str(local_or_shipped(self.tokenizer_name))  # assets/demo-target from any directory
            looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1  # a hub id is owner/name
            if looks_local and not os.path.exists(os.path.expanduser(name)):
                raise FileNotFoundError(
                    f"tokenizer / target {name!r} does not exist (data.tokenizer, linked from model.target.path): "
                    "give an existing model directory or a hub id"
                )
            with loading("--data.tokenizer (linked from --model.target.path)", name):
                self._tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    @property
    def encoder(self) -> ConversationEncoder | CompletionEncoder:
        """Parses, tokenises and masks the records of the resolved data format (:attr:`data_format`)."""
        if self._encoder is None:
            self._encoder = make_encoder(
                self.data_format.format,
                self.tokenizer,
                max_length=self.max_length,
                min_supervised_tokens=self.min_supervised_tokens,
                block_size=self.block_size,
                template_kwargs=self.chat_template_kwargs,
            )
        return self._encoder

    @property
    def data_format(self) -> FormatChoice:
        """The format the records are read in (``data.format``, ``auto`` resolved from the first record and the
        tokenizer's chat template; ``data/formats.py``). Resolved once and logged; the resolved value also replaces
        ``format`` in this module's hyper-parameters, so checkpoints carry it."""
        if self._format_choice is None:
            # the records every split reads (validation's also when it reads a cache: its eval prompts are records)
            splits = [s for s in ("train", "validation", "test") if self._has_records(s)]
            sources = [self._source(s) for s in splits if self.cache_for(s) is None or s == "validation"]
            caches = [self.cache_for(s) for s in ("train", "validation") if self.cache_for(s) is not None]
            self.adopt_format(
                choose_format(
                    self.format, self.tokenizer, str(self.tokenizer_name), sources, caches, self.max_record_bytes
                )
            )
        return self._format_choice

    @property
    def resolved_format(self) -> FormatChoice | None:
        """:attr:`data_format` if it has been resolved already, else None (resolves nothing)."""
        return self._format_choice

    def adopt_format(self, choice: FormatChoice) -> None:
        """Read the records in ``choice`` (resolved once, e.g. by the CLI's check of the same options before the
        model is built, so it is logged once); the resolved format also goes into the hyper-parameters."""
        self._format_choice, self._encoder = choice, None
        self.hparams["format"] = choice.format

    @property
    def vocab_size(self) -> int:
        """Size of the tokenizer's vocabulary including added tokens (``len(tokenizer)``)."""
        return len(self.tokenizer)

    @property
    def mask_token_id(self) -> int:
        """Id of the drafter's mask token (:func:`resolve_mask_token`: ``mask_token``, the tokenizer's, or a chosen
        unused special token; the model records the id in its hyperparameters)."""
        token, token_id = resolve_mask_token(self.tokenizer, self.mask_token, self.tokenizer_name)
        self.mask_token = self.mask_token or (None if self.tokenizer.mask_token else token)  # a choice is logged once
        return token_id

    @property
    def pad_token_id(self) -> int:
        """Id written on padding positions (the tokenizer's pad token, else its eos token)."""
        return resolve_pad_token_id(self.tokenizer, self.tokenizer_name)

    # ------------------------------------------------------------------------------------------------- checks
    def setup(self, stage: str) -> None:
        self.check_sources(stage)

    def check_sources(self, stage: str, configured_only: bool = False, options: dict[str, str] | None = None) -> None:
        """Sniff every local data file this stage reads (layout, encoding) and validate a sample of its records,
        before the first step; the CLI also runs it before the model (and its target) is built, ``configured_only``
        (a split without files is left to ``setup``, after the model's own option checks). ``options`` renames the
        option an error names per split (a command's own ``--data``)."""
        splits = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",)}.get(stage, ())
        for split in splits:
            if self.cache_for(split) is not None or (split == "validation" and stage == "fit" and not self.val_files):
                continue
            if configured_only and not (self.train_files or self.val_files or self.test_files):
                continue
            source = self._source(split, options)
            if not source.is_hub:
                kind = "conversation" if self.data_format.format == "chat" else "completion record"
                what = f"{kind} (data.format: {self.data_format.format})"
                preflight_data_files(
                    source.files,
                    self._option(split, options),
                    self.max_record_bytes,
                    parse=self.encoder.parse,
                    what=what,
                )

    # ------------------------------------------------------------------------------------------------- streams
    def _has_records(self, split: str) -> bool:
        """Whether ``split`` has record files (or a hub id) of its own or carved out of the training files by id."""
        files = {"train": self.train_files, "validation": self.val_files}.get(split, self.test_files or self.val_files)
        return bool(files or (self.id_split is not None and self.train_files))

    def _option(self, split: str, options: dict[str, str] | None = None) -> str:
        """The option an error about ``split``'s files names: the data module's own, or a command's (``options``)."""
        option = {"train": "data.train_files", "validation": "data.val_files", "test": "data.test_files"}
        return (option | (options or {}))[split]

    def _source(self, split: str, options: dict[str, str] | None = None) -> DataSource:
        if split == "test" and not self.test_files:
            split = "validation"  # the test stage reads the validation files unless it has its own
        spec, named = {"train": self.train_files, "validation": self.val_files, "test": self.test_files}[split], split
        if spec is None and self.id_split is not None:
            spec, named = self.train_files, "train"  # validation / test carved out of the training files by id
        if spec is None:  # an OptionError: one line naming what to set (the CLI adds the run's config.yaml)
            raise OptionError(f"no {self._option(split, options)} configured: the {split} split has no files")
        return resolve_source(spec, default_split=split, option=self._option(named, options))

    def _distributed_context(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.global_rank, trainer.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def build_dataset(
        self, split: Literal["train", "validation", "test"], rank: int | None = None, world_size: int | None = None
    ) -> PackedConversationStream:
        """The packed stream of ``split`` for one rank (defaults: the trainer's / torch.distributed's, else 0 of 1)."""
        if rank is None or world_size is None:
            rank, world_size = self._distributed_context()
        source = self._source(split)
        limit = self.limit_val_samples if split != "train" else None
        records = open_record_stream(source, limit=limit, max_record_bytes=self.max_record_bytes)
        if split == "train" and self.shuffle_buffer > 0:
            records = records.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        if world_size > 1:
            records = split_dataset_by_node(records, rank=rank, world_size=world_size)
        self._counts[split] = SharedCounts(self.num_workers)
        keep = None if self.id_split is None else (self.id_split, split)
        return PackedConversationStream(
            records,
            source,
            self.encoder,
            self.seq_len,
            self.pad_token_id,
            self.on_bad_record,
            self._counts[split],
            keep,
        )

    def cache_for(self, split: str) -> str | list[str] | None:
        """The cache directory (or list) that ``split`` reads from, or None when it streams records."""
        return self.train_cache if split == "train" else self.val_cache

    def _cached_dataloader(self, split: str, rank: int | None = None, world_size: int | None = None):
        if rank is None or world_size is None:
            rank, world_size = self._distributed_context()
        training = split == "train"
        dataset = CachedFeatureDataset(
            self.cache_for(split), self.batch_size, training and self.shuffle_buffer > 0, self.seed, rank, world_size
        )
        passes = itertools.count()

        def before_pass() -> tuple[int, int]:
            trainer = getattr(self, "trainer", None)
            epoch = trainer.current_epoch if trainer is not None else next(passes)
            resume, skip = self._resume, 0
            if training and resume and trainer is not None and resume["epoch"] == trainer.current_epoch:
                self._resume, skip = None, resume["batches_consumed"]
            return epoch, skip

        return CachedFeatureLoader(dataset, self.num_workers, before_pass)

    def _dataloader(self, split: Literal["train", "validation", "test"], **dataset_kwargs: Any) -> CountingDataLoader:
        if self.cache_for(split) is not None:
            return self._cached_dataloader(split, **dataset_kwargs)
        dataset = self.build_dataset(split, **dataset_kwargs)
        if self.num_workers > 0:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

        passes = itertools.count()  # per loader, so loaders built for different ranks do not share an epoch

        def before_pass() -> None:
            # Only a shuffled training stream gets an epoch: datasets reorders shards whenever epoch > 0.
            trainer = getattr(self, "trainer", None)
            epoch = next(passes)
            if split == "train" and self.shuffle_buffer > 0:
                dataset.set_epoch(trainer.current_epoch if trainer is not None else epoch)

        def batches_to_skip() -> int:
            trainer = getattr(self, "trainer", None)
            resume, self._resume = self._resume, None
            if split != "train" or not resume or trainer is None or resume["epoch"] != trainer.current_epoch:
                return 0
            return resume["batches_consumed"]

        return CountingDataLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            before_pass=before_pass,
            after_pass=lambda: self.log_data_stats(split),
            batches_to_skip=batches_to_skip,
        )

    def train_dataloader(self, **dataset_kwargs: Any) -> CountingDataLoader:
        """Shuffled, packed training batches (``dataset_kwargs``: ``rank``/``world_size`` overrides for tests)."""
        return self._dataloader("train", **dataset_kwargs)

    def val_dataloader(self, **dataset_kwargs: Any) -> CountingDataLoader:
        """Validation batches in file order."""
        return self._dataloader("validation", **dataset_kwargs)

    def test_dataloader(self, **dataset_kwargs: Any) -> CountingDataLoader:
        """Test batches in file order (``test_files``, else the validation files)."""
        return self._dataloader("test", **dataset_kwargs)

    # ------------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, int]:
        """Saved in checkpoints: how far into the current training epoch the stream was consumed.

        The stream's order is a function of (seed, epoch), so resuming replays it and skips the batches already
        trained on; a resumed run sees exactly the batches an uninterrupted run would have seen.
        """
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return {}
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        # ``processed`` (not ``completed``): a checkpoint taken in on_train_batch_end has processed the batch but not
        # yet marked it completed; both agree at validation time
        return {"epoch": trainer.current_epoch, "batches_consumed": progress.processed}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._resume = dict(state_dict) if state_dict else None

    # ------------------------------------------------------------------------------------------ eval prompts
    def eval_conversations(self) -> list[Conversation] | list[Completion]:
        """The first ``num_eval_prompts`` valid validation examples (file order) that have a prompt: conversations
        with a user prompt before their first reply, or completion records with a non-blank prompt."""
        if self._eval_conversations is None:
            source = self._source("validation")
            stream = open_record_stream(source, max_record_bytes=self.max_record_bytes)
            raws = (raw_record_from_example(example, source) for example in stream)
            examples = iter_conversations(raws, on_bad_record="skip", parse=self.encoder.parse)
            self._eval_conversations = choose_eval_conversations(
                examples, self.num_eval_prompts, self.encoder, self.seq_len, self.id_split
            )
        return self._eval_conversations

    def eval_prompts(self) -> list[list[int]]:
        """Token ids of each eval example's prompt: a conversation up to and including the first assistant turn's
        generation prompt, a completion record's prompt as plain text."""
        return [self.encoder.example_prompt_ids(example) for example in self.eval_conversations()]
