"""The Markov head: a low-rank logit bias from the previous token of the block.

Forms, equations and parameter names (the checkpoint keys): docs/design/design.md §4; why the ``hidden``/``identity``
form is the DFlash-2 CandidateSelector: §6.4."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from dspark_lightning.errors import OptionError

KINDS = ("vanilla", "gated", "rnn")
GATE_INPUTS = ("hidden+prev", "hidden")
GATE_ACTIVATIONS = ("sigmoid", "identity")


class MarkovHead(nn.Module):
    """Low-rank previous-token logit bias (the math: docs/design/design.md §4).

    Args:
        verifier_vocab_size: V, the rows of ``markov_w1`` (previous tokens are target ids).
        draft_vocab_size: Vd, the logits the bias covers (``markov_w2`` is ``Linear(r, Vd)``).
        rank: r, the width of the transition feature.
        hidden_size: H, the draft hidden size the gate (gated) or the joint projection (rnn) reads.
        kind: ``vanilla``, ``gated`` or ``rnn`` (§4.1-§4.3).
        gate_input: what a gated head's gate reads: ``hidden+prev`` or ``hidden`` (§4.2).
        gate_activation: ``sigmoid`` (with a gate bias) or ``identity`` (no bias) (§4.2).
    """

    def __init__(
        self,
        verifier_vocab_size: int,
        draft_vocab_size: int,
        rank: int,
        hidden_size: int,
        kind: str = "vanilla",
        gate_input: str = "hidden+prev",
        gate_activation: str = "sigmoid",
    ) -> None:
        super().__init__()
        self.config = MarkovHeadConfig(kind, rank, gate_input, gate_activation)  # validates the names
        if rank < 1:
            raise ValueError(
                f"Markov head rank must be a positive integer, got {rank!r} (use no head / rank 0 to disable it)"
            )
        for name, value in (
            ("verifier_vocab_size", verifier_vocab_size),
            ("draft_vocab_size", draft_vocab_size),
            ("hidden_size", hidden_size),
        ):
            if value < 1:
                raise ValueError(f"MarkovHead {name} must be >= 1, got {value}")
        if draft_vocab_size > verifier_vocab_size:
            raise ValueError(f"draft_vocab_size {draft_vocab_size} exceeds verifier_vocab_size {verifier_vocab_size}")

        # the sizes come from the target, so they are not in the config (kind, rank and gate form: ``self.config``)
        self.verifier_vocab_size = verifier_vocab_size
        self.draft_vocab_size = draft_vocab_size
        self.hidden_size = hidden_size

        self.markov_w1 = nn.Embedding(verifier_vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=1.0)
        nn.init.zeros_(self.markov_w2.weight)
        if kind == "gated":
            in_features = hidden_size + rank if gate_input == "hidden+prev" else hidden_size
            self.gate_proj = nn.Linear(in_features, rank, bias=gate_activation != "identity")
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    @property
    def is_path_dependent(self) -> bool:
        """True for the rnn head: its bias depends on every earlier token, not only the previous one."""
        return self.config.kind == "rnn"

    def extra_repr(self) -> str:
        c = self.config
        gate = f", gate_input={c.gate_input}, gate_activation={c.gate_activation}" if c.kind == "gated" else ""
        return f"kind={c.kind}, rank={c.rank}{gate}"

    # ------------------------------------------------------------------ features
    def gate(self, hidden: torch.Tensor, prev_embedding: torch.Tensor) -> torch.Tensor:
        """The gate g (shape [..., r]) of the gated head; broadcasts ``hidden`` against ``prev_embedding``."""
        if self.config.gate_input == "hidden+prev":
            shape = torch.broadcast_shapes(hidden.shape[:-1], prev_embedding.shape[:-1])
            joint = torch.cat(
                (hidden.expand(*shape, hidden.shape[-1]), prev_embedding.expand(*shape, self.config.rank)), -1
            )
            pre = self.gate_proj(joint)
        else:
            pre = self.gate_proj(hidden)
        return torch.sigmoid(pre) if self.config.gate_activation == "sigmoid" else pre

    def transition_features(
        self, prev_token_ids: torch.Tensor, hidden: torch.Tensor, prev_embedding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """u(a, h) with bias = W2^T u, shape broadcast(prev[...], hidden[..., H]) + [r]. Not defined for rnn.
        ``prev_embedding``: W1[prev_token_ids] when the caller already looked it up."""
        if self.is_path_dependent:
            raise ValueError("the rnn Markov head is path dependent: it has no per-pair transition features")
        if prev_embedding is None:
            prev_embedding = self.markov_w1(prev_token_ids)
        if self.config.kind == "vanilla":
            return prev_embedding
        return prev_embedding * self.gate(hidden, prev_embedding)

    # ------------------------------------------------------------------ biases
    def block_bias(
        self, prev_token_ids: torch.Tensor, hidden: torch.Tensor, prev_embedding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Teacher-forced bias for whole blocks: prev [N, B] (target ids), hidden [N, B, H] -> [N, B, Vd].
        ``prev_embedding`` [N, B, r]: W1[prev_token_ids] when the caller already looked it up (vanilla, gated)."""
        if prev_token_ids.shape != hidden.shape[:-1]:
            raise ValueError(
                f"prev_token_ids {tuple(prev_token_ids.shape)} must match hidden {tuple(hidden.shape)}[:-1]"
            )
        if not self.is_path_dependent:
            return self.markov_w2(self.transition_features(prev_token_ids, hidden, prev_embedding))
        state = None
        biases = []
        for slot in range(prev_token_ids.shape[1]):
            bias, state = self.step_bias(prev_token_ids[:, slot], hidden[:, slot], state)
            biases.append(bias)
        return torch.stack(biases, dim=1)

    def add_block_bias(
        self,
        logits: torch.Tensor,
        prev_token_ids: torch.Tensor,
        hidden: torch.Tensor,
        prev_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``logits + block_bias(...)`` for logits [N, B, Vd]. Where the bias is W2 u (vanilla, gated) it is added
        inside the matmul (``addmm``): no [N, B, Vd] bias tensor and no separate add pass (a training step's hot path)."""
        if self.is_path_dependent:
            bias = self.block_bias(prev_token_ids, hidden, prev_embedding)
            return logits + bias.to(logits.dtype)
        features = self.transition_features(prev_token_ids, hidden, prev_embedding)
        rows = logits.reshape(-1, logits.shape[-1])
        weight = self.markov_w2.weight
        if not torch.is_autocast_enabled(rows.device.type):  # autocast casts all three itself
            features, weight = features.to(rows.dtype), weight.to(rows.dtype)
        return torch.addmm(rows, features.reshape(rows.shape[0], -1), weight.t()).view(logits.shape)

    def step_bias(
        self, prev_token_ids: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot: prev [N], hidden [N, H], state [N, r] or None -> (bias [N, Vd], new state).

        The state is only used by the rnn head (it starts at zero); other heads return ``None``.
        """
        if not self.is_path_dependent:
            return self.markov_w2(self.transition_features(prev_token_ids, hidden)), None
        prev_embedding = self.markov_w1(prev_token_ids)
        if state is None:
            state = prev_embedding.new_zeros(prev_embedding.shape)
        gate, candidate, out = self.joint_proj(torch.cat((state, prev_embedding, hidden), -1)).chunk(3, dim=-1)
        keep = torch.sigmoid(gate)
        new_state = keep * state + (1.0 - keep) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(out)), new_state


@dataclass(frozen=True)
class MarkovHeadConfig:
    """What a config file says about the Markov head; sizes come from the target when the drafter is built.

    In YAML: ``markov_head: {kind: gated, rank: 64}`` (``configs/heads/``); null for pure DFlash.
    """

    kind: Literal["vanilla", "gated", "rnn"] = "vanilla"
    """``vanilla``: bias(a) = W2^T W1[a] (the DSpark default); ``gated``: bias(a, h) = W2^T (W1[a] * g(h, a));
    ``rnn``: a recurrent state carried across the block (path dependent, so it has no Selector form)."""
    rank: int = 256
    """Low-rank dimension r of the bias (>= 1; rank 0 is read as "no head" by ``DrafterConfig``)."""
    gate_input: Literal["hidden+prev", "hidden"] = "hidden+prev"
    """Gated head only: the gate reads ``hidden+prev`` (the DSpark checkpoint form) or ``hidden`` (DFlash-2)."""
    gate_activation: Literal["sigmoid", "identity"] = "sigmoid"
    """Gated head only: ``sigmoid``, or ``identity`` (no activation, no gate bias; with ``hidden``: the Selector)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OptionError(
                f"model.drafter.markov_head.kind: unknown Markov head kind {self.kind!r}; expected one of {KINDS}"
            )
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise OptionError(
                f"model.drafter.markov_head.rank must be an integer >= 0 (0 = no head), got {self.rank!r}"
            )
        if self.gate_input not in GATE_INPUTS:
            raise OptionError(
                f"model.drafter.markov_head.gate_input: unknown {self.gate_input!r}; expected one of {GATE_INPUTS}"
            )
        if self.gate_activation not in GATE_ACTIVATIONS:
            raise OptionError(
                f"model.drafter.markov_head.gate_activation: unknown {self.gate_activation!r}; "
                f"expected one of {GATE_ACTIVATIONS}"
            )

    @classmethod
    def selector(cls, rank: int = 256) -> MarkovHeadConfig:
        """The DFlash-2 CandidateSelector as a gated head: g = Wg h (no activation, no bias)."""
        return cls("gated", rank, gate_input="hidden", gate_activation="identity")

    @property
    def is_selector_form(self) -> bool:
        """True for the DFlash-2 CandidateSelector form (gated, ``hidden`` input, ``identity`` activation)."""
        return (self.kind, self.gate_input, self.gate_activation) == ("gated", "hidden", "identity")

    @property
    def label(self) -> str:
        """Short name in reports: ``vanilla``, ``gated``, ``selector`` or ``rnn``."""
        return "selector" if self.is_selector_form else self.kind

    @classmethod
    def from_dict(cls, value: dict) -> MarkovHeadConfig:
        """Read ``dataclasses.asdict`` output, and the forms older checkpoints and configs stored.

        Old forms (kept so checkpoints already on disk load): ``{"class_path": "...VanillaMarkov" | "...GatedMarkov" |
        "...SelectorMarkov" | "...RnnMarkov" | "...MarkovHeadConfig", "init_args": {...}}``, and the field
        ``head_type`` for ``kind``.
        """
        if "class_path" in value:
            class_name = value["class_path"].rpartition(".")[2]
            forms = {
                "VanillaMarkov": {"kind": "vanilla"},
                "GatedMarkov": {"kind": "gated"},
                "SelectorMarkov": {"kind": "gated", "gate_input": "hidden", "gate_activation": "identity"},
                "RnnMarkov": {"kind": "rnn"},
                "MarkovHeadConfig": {},
            }
            if class_name not in forms:
                raise ValueError(
                    f"unknown Markov head class_path {value['class_path']!r}; expected one of {sorted(forms)}"
                )
            value = {**forms[class_name], **(value.get("init_args") or {})}
        value = dict(value)
        if "head_type" in value:
            value["kind"] = value.pop("head_type")
        return cls(**value)

    @classmethod
    def coerce(cls, value: MarkovHeadConfig | dict | None) -> MarkovHeadConfig | None:
        """A config from a config, a dict (``from_dict``) or None (no head)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        raise TypeError(f"cannot read a Markov head config from {value!r}")

    def build(self, verifier_vocab_size: int, draft_vocab_size: int, hidden_size: int) -> MarkovHead:
        return MarkovHead(
            verifier_vocab_size=verifier_vocab_size,
            draft_vocab_size=draft_vocab_size,
            hidden_size=hidden_size,
            **dataclasses.asdict(self),
        )
