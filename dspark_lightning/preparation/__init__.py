"""Data preparation that runs the target model or its tokenizer: the offline feature cache (``feature_cache``, the
``cache`` command) and the reduced draft vocabulary (``draft_vocab``, the ``draft-vocab`` command)."""

from dspark_lightning import lazy_exports

_EXPORTS = {
    "cache_command": "dspark_lightning.preparation.feature_cache",
    "write_cache": "dspark_lightning.preparation.feature_cache",
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
