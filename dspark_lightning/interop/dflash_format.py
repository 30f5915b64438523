"""The speculators DFlash format (``export --format dflash``), which vLLM's ``dflash`` method serves, on CPU too: the
DSpark export without Markov or confidence fields and tensors, ``architectures: ["DFlashDraftModel"]``, non-causal.
Written only for drafts that do not depend on what is dropped: no Markov head and ``sample_from_anchor: false`` (vLLM's
DFlash proposer always spends slot 0 on the anchor). Field by field: docs/guides/serve_with_vllm.md."""

from __future__ import annotations

from dspark_lightning.errors import UnsupportedError

DFLASH_ARCHITECTURE = "DFlashDraftModel"  # vLLM's registry name for the Qwen3 DFlash drafter
DSPARK_ONLY_FIELDS = (
    "markov_rank",
    "markov_head_type",
    "markov_gate_input",
    "markov_gate_activation",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "confidence_temperature",
)
DSPARK_ONLY_TENSORS = ("markov_head.", "confidence_head.")
FORMATS = ("auto", "dspark", "dflash")


def dflash_refusal(drafter) -> str | None:
    """Why ``drafter`` cannot be written in the DFlash format (None when it can)."""
    head = drafter.markov_head
    if head is not None:
        return (
            f"the drafter has a {head.config.label} Markov head, which the DFlash format has no place for (its drafts "
            "depend on it): export it with --format dspark"
        )
    if drafter.config.sample_from_anchor:
        return (
            "the drafter was trained with sample_from_anchor: true, but vLLM's DFlash proposer spends slot 0 on the "
            "anchor (sample_from_anchor: false): export it with --format dspark, or train with sample_from_anchor: false"
        )
    return None


def resolve_format(drafter, format: str, candidate_selector: bool = False) -> str:
    """``auto`` is ``dflash`` for a drafter that loses nothing in it (no Markov or confidence head,
    ``sample_from_anchor: false``), else ``dspark``; an explicit ``dflash`` the drafter cannot take is refused."""
    if format not in FORMATS:
        raise UnsupportedError(f"--format {format!r}: expected one of {FORMATS}")
    if format == "auto":
        lossless = dflash_refusal(drafter) is None and drafter.confidence_head is None and not candidate_selector
        return "dflash" if lossless else "dspark"
    if format == "dflash":
        reason = "--candidate_selector true writes a Markov head layout" if candidate_selector else None
        reason = reason or dflash_refusal(drafter)
        if reason:
            raise UnsupportedError(f"--format dflash: {reason}")
    return format


def dflash_config(dspark_config: dict) -> dict:
    """The DFlash ``config.json`` for the DSpark one ``build_config`` wrote for the same drafter."""
    config = {key: value for key, value in dspark_config.items() if key not in DSPARK_ONLY_FIELDS}
    speculators = dict(config["speculators_config"], algorithm="dflash")
    return config | {
        "architectures": [DFLASH_ARCHITECTURE],
        "speculators_model_type": "dflash",
        "speculators_config": speculators,
    }


def dflash_tensors(tensors: dict) -> dict:
    """The DSpark export's tensors without the Markov and confidence heads."""
    return {key: value for key, value in tensors.items() if not key.startswith(DSPARK_ONLY_TENSORS)}
