"""Data: conversations or completion records -> tokenised, loss-masked, packed training samples.

The record formats and the packed-batch contract every training component relies on: docs/design/data.md §1, §4."""

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
