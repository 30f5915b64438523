"""Evaluation sets, the one home of their code: named prompt lists (``sets``: ``sharegpt_heldout``, ``humaneval``),
one set's results pooled over prompts with bootstrap intervals (``summary``), decoding them during training
(``training``, logged by ``SpeculativeDecodingCallback``) and measured decoding with wall clock (``measure``, what
``decode --eval_sets`` and ``report-recipe`` print)."""
