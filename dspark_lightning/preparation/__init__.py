"""Data preparation that runs the target model or its tokenizer; one module per command: ``regenerate`` (on-policy
data from the target, with ``regenerate_completion`` for base models and ``greedy``), ``cache`` (the offline feature
cache) and ``draft_vocab`` (the reduced draft vocabulary, the ``draft-vocab`` command)."""

from dspark_lightning import lazy_exports

_EXPORTS = {
    "cache_command": "dspark_lightning.preparation.cache",
    "write_cache": "dspark_lightning.preparation.cache",
    "build_draft_vocab": "dspark_lightning.preparation.draft_vocab",
    "count_tokens": "dspark_lightning.preparation.draft_vocab",
    "draft_vocab_command": "dspark_lightning.preparation.draft_vocab",
    "save_draft_vocab": "dspark_lightning.preparation.draft_vocab",
    "select_draft_vocab": "dspark_lightning.preparation.draft_vocab",
    "special_token_ids": "dspark_lightning.preparation.draft_vocab",
    "verifier_vocab_size": "dspark_lightning.preparation.draft_vocab",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)  # so importing one submodule does not import the other
