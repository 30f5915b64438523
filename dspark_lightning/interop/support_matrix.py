"""Which exported Markov head each serving engine serves, as data (``SUPPORT``), and the checks ``export`` applies.

Rows are (engine, version) pairs this project has checked (docs/guides/serve_with_vllm.md says how); a head kind is
``none``, ``vanilla``, ``gated``, ``rnn`` or ``selector`` (the DFlash-2 form, in either layout). ``vllm-dspark`` is
vLLM's ``dspark`` method (``Qwen3DSparkForCausalLM``, Model Runner V2: GPU only), ``vllm-dflash`` its ``dflash``
method (``DFlashDraftModel``, V1 and V2: CPU too), which a ``--format dflash`` export is read by.
"""

from __future__ import annotations

from typing import NamedTuple

from dspark_lightning.errors import UnsupportedError

HEAD_KINDS = ("none", "vanilla", "gated", "rnn", "selector")
ENGINES = ("speculators", "vllm-dspark", "vllm-dflash")
FORMAT_ENGINE = {"dspark": "vllm-dspark", "dflash": "vllm-dflash"}  # the vLLM method that reads each format


class Support(NamedTuple):
    servable: bool
    note: str


_YES, _NO_HEAD = Support(True, ""), "the DFlash format has no Markov head: export it with --format dspark"
_GATE_MISSING = "vLLM's DSparkMarkovHead holds markov_w1/markov_w2 only: 'no module or parameter named markov_head.%s'"
# fmt: off
SUPPORT: dict[tuple[str, str], dict[str, Support]] = {
    ("speculators", "0.9"): {
        "none": _YES, "vanilla": _YES, "rnn": _YES,
        "gated": Support(True, "the hidden+prev/sigmoid gate only; other gate forms are refused on the gate's shape"),
        "selector": Support(False, "DSparkDraftModel has no CandidateSelector: the candidate_selector layout loads "
                                   "as the backbone alone, the markov_head layout is refused on the gate's shape"),
    },
    ("vllm-dspark", "0.32"): {
        "none": Support(True, "markov_rank 0; Model Runner V2 only, so a GPU"),
        "vanilla": Support(True, "Model Runner V2 only, so a GPU"),
        "gated": Support(False, _GATE_MISSING % "gate_up_proj"),
        "rnn": Support(False, _GATE_MISSING % "joint_proj"),
        "selector": Support(False, "vLLM's DSpark model has no candidate_selector tensors or gate"),
    },
    ("vllm-dflash", "0.32"): {
        "none": Support(True, "served by Model Runner V1 (CPU) and V2; trained with sample_from_anchor: false"),
        "vanilla": Support(False, _NO_HEAD), "gated": Support(False, _NO_HEAD), "rnn": Support(False, _NO_HEAD),
        "selector": Support(False, _NO_HEAD + " (vLLM's dflash2 reads another layout)"),
    },
}
# fmt: on


def head_kind(config: dict) -> str:
    """The head kind an export's ``config.json`` describes (a DFlash export has none)."""
    if config.get("dflash2_candidate_selector"):
        return "selector"
    if config.get("speculators_model_type") != "dspark" or not int(config.get("markov_rank") or 0):
        return "none"
    kind = config.get("markov_head_type", "vanilla")
    form = (config.get("markov_gate_input"), config.get("markov_gate_activation"))
    return "selector" if kind == "gated" and form == ("hidden", "identity") else kind


def support(engine: str, head: str, version: str | None = None) -> dict[str, Support]:
    """{version: Support} of ``head`` on ``engine`` for every version the matrix knows (or just ``version``)."""
    if engine not in ENGINES or head not in HEAD_KINDS:
        raise ValueError(f"engine {engine!r} / head {head!r}: expected one of {ENGINES} / {HEAD_KINDS}")
    return {v: row[head] for (e, v), row in SUPPORT.items() if e == engine and version in (None, v)}


def engine_for(config: dict, target_engine: str) -> str:
    """The matrix engine that serves an export's format for ``target_engine`` (``speculators`` or ``vllm``)."""
    return "speculators" if target_engine == "speculators" else FORMAT_ENGINE[config["speculators_model_type"]]


def unservable(config: dict, target_engine: str) -> str | None:
    """Why no version the matrix knows of ``target_engine`` serves the head this export writes; None if one does."""
    engine, head = engine_for(config, target_engine), head_kind(config)
    verdicts = support(engine, head)
    if any(s.servable for s in verdicts.values()):
        return None
    versions = ", ".join(f"{engine} {v}" for v in verdicts)
    return f"a {head} Markov head is served by no {target_engine} version this project knows ({versions}): " + (
        "; ".join(sorted({s.note for s in verdicts.values()}))
    )


def check_servable(config: dict, target_engine: str | None) -> str | None:
    """``export``'s check: the one-line warning for a head vLLM cannot serve (None when it can), or, with
    ``target_engine`` set, an ``UnsupportedError`` naming ``--target_engine`` when that engine cannot."""
    if target_engine is None:
        reason = unservable(config, "vllm")
        return None if reason is None else f"warning: {reason} (train a vanilla head or none for vLLM today)"
    if target_engine not in ("speculators", "vllm"):
        raise UnsupportedError(f"--target_engine {target_engine!r}: expected 'speculators' or 'vllm'")
    reason = unservable(config, target_engine)
    if reason is not None:
        raise UnsupportedError(f"--target_engine {target_engine}: {reason}")
    return None
