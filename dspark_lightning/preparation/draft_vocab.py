"""``dspark-lightning draft-vocab``: a reduced draft vocabulary (d2t / t2d) from the loss-masked token frequencies.

How tokens are counted and chosen, and the file: docs/design/data.md §6.3; training with it
(``model.drafter.draft_vocab``, the LM head and the Markov head's W2 then cover only those Vd tokens) and its export
(offset ``d2t``, bool ``t2d``): docs/design/data.md §6.4, docs/guides/export_and_serving.md."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from safetensors.torch import save_file

from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.errors import OptionError
from dspark_lightning.models.vocab import DraftVocab

logger = logging.getLogger(__name__)


def count_tokens(batches: Iterable[dict[str, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """Frequencies [V] (int64) of ``input_ids`` at positions where ``loss_mask`` is set."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for batch in batches:
        ids = batch["input_ids"][batch["loss_mask"].bool()].long()
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ValueError(f"token id {int(ids.max())} is outside the vocabulary of size {vocab_size}")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def select_draft_vocab(counts: torch.Tensor, size: int, always_include: Iterable[int] = ()) -> DraftVocab:
    """The ``size`` most frequent ids (ties -> lower id), with ``always_include`` forced in."""
    counts = torch.as_tensor(counts).long()
    V = counts.numel()
    forced = sorted({int(i) for i in always_include})
    if not 1 <= size <= V:
        raise OptionError(f"--size: a draft vocabulary size must be in [1, {V}] (the target's vocabulary), got {size}")
    if any(not 0 <= i < V for i in forced):
        raise OptionError(f"--always_include: ids {forced} (with the special tokens) must lie in [0, {V})")
    if len(forced) > size:
        raise OptionError(f"--size {size}: too small for the {len(forced)} always-included ids")
    keys = counts.clone()
    keys[forced] = torch.iinfo(torch.long).max
    order = torch.sort(-keys, stable=True).indices  # stable: equal counts keep ascending id order
    return DraftVocab(order[:size], V)


def special_token_ids(tokenizer, vocab_size: int, mask_token_id: int | None = None) -> list[int]:
    """The eos, pad and mask ids of ``tokenizer`` (those that exist and lie inside the vocabulary)."""
    ids = [tokenizer.eos_token_id, tokenizer.pad_token_id, getattr(tokenizer, "mask_token_id", None), mask_token_id]
    return sorted({int(i) for i in ids if i is not None and 0 <= int(i) < vocab_size})


def save_draft_vocab(
    vocab: DraftVocab, path: str | Path, counts: torch.Tensor | None = None, metadata: dict | None = None
) -> Path:
    """Write ``d2t`` (absolute ids), ``t2d`` and optionally ``counts`` to a safetensors file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"d2t": vocab.d2t.cpu().contiguous(), "t2d": vocab.t2d.cpu().contiguous()}
    if counts is not None:
        tensors["counts"] = torch.as_tensor(counts).long().cpu().contiguous()
    info = {"format": "dspark-lightning-draft-vocab", "d2t": "absolute target ids, ascending"}
    info |= {k: json.dumps(v) if not isinstance(v, str) else v for k, v in (metadata or {}).items()}
    save_file(tensors, str(path), metadata=info)
    return path


def verifier_vocab_size(tokenizer_name: str, tokenizer, trust_remote_code: bool = False) -> int:
    """The model config's ``vocab_size`` when ``tokenizer_name`` has one, else ``len(tokenizer)``."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(tokenizer_name, trust_remote_code=trust_remote_code)
        config = getattr(config, "text_config", None) or config
        return max(int(config.vocab_size), len(tokenizer))
    except (OSError, ValueError, AttributeError, TypeError):
        return len(tokenizer)


def _supervised_counts(
    tokenizer: str, data, seq_len: int, batch_size: int, max_rows, vocab_size, option: str = "--data", **data_options
):
    """(counts [V] of the loss-masked tokens of ``data``, the data module that read them, V); ``option`` names
    ``data`` in errors."""
    dm = ShareGPTDataModule(
        tokenizer, train_files=data, seq_len=seq_len, batch_size=batch_size, shuffle_buffer=0, block_size=0,
        **data_options,
    )  # fmt: skip
    dm.check_sources("fit", options={"train": option})  # every data file sniffed before counting, named as given
    V = vocab_size or verifier_vocab_size(tokenizer, dm.tokenizer, data_options.get("trust_remote_code", False))
    loader = dm.train_dataloader(rank=0, world_size=1)
    counts = count_tokens(loader if max_rows is None else _limit_rows(loader, max_rows), V)
    if int(counts.sum()) == 0:  # a vocabulary "covering 0% of 0 tokens" would be useless, not a result
        raise ValueError(f"{option} {data!r}: no supervised token to count (skipped records: {dm.bad_record_counts()})")
    return counts, dm, V


def build_draft_vocab(
    tokenizer: str,
    data: str | Sequence[str],
    size: int,
    *,
    vocab_size: int | None = None,
    seq_len: int = 4096,
    batch_size: int = 16,
    max_rows: int | None = None,
    always_include: Iterable[int] = (),
    mask_token: str | None = None,
    trust_remote_code: bool = False,
    chat_template_kwargs: dict | None = None,
    held_out: str | Sequence[str] | None = None,
    format: str = "auto",
) -> tuple[DraftVocab, torch.Tensor, dict]:
    """Count the loss-masked tokens of ``data`` and select the draft vocabulary; returns (vocab, counts, summary).

    ``held_out``: data the vocabulary is *not* built from; the summary adds its coverage there (``held_out_coverage``),
    which is what drafting unseen conversations meets, while ``coverage`` is measured on the data it was chosen from.
    """
    options = dict(
        mask_token=mask_token, trust_remote_code=trust_remote_code, chat_template_kwargs=chat_template_kwargs,
        format=format,
    )  # fmt: skip
    counts, dm, V = _supervised_counts(tokenizer, data, seq_len, batch_size, max_rows, vocab_size, **options)
    try:
        mask_id = dm.mask_token_id
    except ValueError:
        mask_id = None
    forced = sorted(set(special_token_ids(dm.tokenizer, V, mask_id)) | {int(i) for i in always_include})
    vocab = select_draft_vocab(counts, size, forced)
    total = int(counts.sum())
    summary = {
        "tokenizer": tokenizer,
        "verifier_vocab_size": V,
        "draft_vocab_size": size,
        "data_format": dm.data_format.format,
        "supervised_tokens": total,
        "distinct_tokens": int((counts > 0).sum()),
        "coverage": float(counts[vocab.d2t].sum()) / total,
        "always_include": forced,
        "bad_records": dm.bad_record_counts("train"),
    }
    if held_out is not None:
        held, held_dm, _ = _supervised_counts(
            tokenizer, held_out, seq_len, batch_size, None, V, option="--held_out", **options
        )
        summary["held_out_supervised_tokens"] = int(held.sum())
        summary["held_out_coverage"] = float(held[vocab.d2t].sum()) / int(held.sum())
        summary["held_out_bad_records"] = held_dm.bad_record_counts("train")
    return vocab, counts, summary


def _limit_rows(batches, max_rows: int):
    seen = 0
    for batch in batches:
        if seen >= max_rows:
            break
        take = min(max_rows - seen, batch["input_ids"].shape[0])
        seen += take
        yield {k: v[:take] for k, v in batch.items()}


def draft_vocab_command(
    tokenizer: str,
    data: list[str] | str,
    size: PositiveInt,
    output: str,
    vocab_size: PositiveInt | None = None,
    seq_len: PositiveInt = 4096,
    max_rows: PositiveInt | None = None,
    always_include: list[NonNegativeInt] = [],  # noqa: B006 (read only; jsonargparse shows it)
    mask_token: str | None = None,
    trust_remote_code: bool = False,
    held_out: list[str] | str | None = None,
    format: Literal["auto", "chat", "completion"] = "auto",
) -> dict:
    """Build a reduced draft vocabulary (d2t/t2d) from the assistant-token frequencies of a dataset.

    Args:
        tokenizer: the target's tokenizer (path or hub id)
        data: ShareGPT files / globs (quoted) / dirs, or a hub dataset id; one or a list
        size: draft vocabulary size Vd
        output: output .safetensors file (for model.drafter.draft_vocab)
        vocab_size: verifier vocabulary V (default: the model config's)
        seq_len: longest conversation counted (tokens)
        max_rows: stop after this many packed rows
        always_include: extra token ids to force in
        mask_token: mask token when the tokenizer defines none
        trust_remote_code: let transformers run the tokenizer's own code
        held_out: files / globs the vocabulary is not built from: also report its coverage there
        format: the records' format, as data.format: chat, completion (base models) or auto (docs/design/data.md §1.5)
    """
    vocab, counts, summary = build_draft_vocab(
        tokenizer,
        data,
        size,
        vocab_size=vocab_size,
        seq_len=seq_len,
        max_rows=max_rows,
        always_include=always_include,
        mask_token=mask_token,
        trust_remote_code=trust_remote_code,
        held_out=held_out,
        format=format,
    )
    save_draft_vocab(vocab, output, counts, {k: v for k, v in summary.items() if not k.endswith("bad_records")})
    summary["output"] = str(output)
    print(
        f"draft vocabulary of {summary['draft_vocab_size']} / {summary['verifier_vocab_size']} tokens covers "
        f"{summary['coverage']:.2%} of {summary['supervised_tokens']} supervised tokens "
        f"({summary['distinct_tokens']} distinct) -> {output}"
    )
    if held_out is not None:
        print(
            f"held-out coverage: {summary['held_out_coverage']:.2%} of {summary['held_out_supervised_tokens']} "
            f"supervised tokens of {held_out!r} (not counted for the selection)"
        )
    for key in ("bad_records", "held_out_bad_records"):
        if summary.get(key):
            print(f"skipped records ({key.removesuffix('bad_records') or 'data '}): {summary[key]}")
    return summary
