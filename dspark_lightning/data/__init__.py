"""Data: ShareGPT/OpenAI conversations (or, for targets without a chat template, completion records of a prompt and
its continuation: ``data.format``, docs/design/data.md §1.5) -> tokenised, loss-masked, packed training samples.

The batch contract every training component relies on (a dict of tensors, one row per packed sample):

    input_ids     LongTensor[b, S]  token ids; padding positions hold the tokenizer's pad id
    loss_mask     BoolTensor[b, S]  True on supervised tokens only (assistant tokens, or completion tokens)
    document_ids  LongTensor[b, S]  0..n-1 for the documents packed into the row, -1 on padding
    position_ids  LongTensor[b, S]  position inside its own document (0 at every document start), 0 on padding

The drafter's attention mask and rotary positions are derived from ``document_ids`` and ``position_ids``;
the frozen target is run with a block-diagonal causal mask built from the same two fields.
"""

from dspark_lightning import lazy_exports

_EXPORTS = {
    "ShareGPTDataModule": "dspark_lightning.data.datamodule",
    "ConversationEncoder": "dspark_lightning.data.tokenize",
    "CompletionEncoder": "dspark_lightning.data.completion",
    "SequencePacker": "dspark_lightning.data.tokenize",
    "BAD_RECORD_REASONS": "dspark_lightning.data.sharegpt",
    "BadRecordError": "dspark_lightning.data.sharegpt",
    "NotJSONError": "dspark_lightning.data.sharegpt",
}
__all__ = sorted(_EXPORTS)

# so importing one submodule does not pull in lightning/datasets/transformers
__getattr__ = lazy_exports(__name__, _EXPORTS)
