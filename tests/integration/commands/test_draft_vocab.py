"""Draft vocabulary: frequency selection, counting only supervised tokens, the file format, and a full run
(build the vocabulary -> train a DSparkModule with it for two steps -> export -> load back with the same logits),
and the drafter's gathered head rows (reused while decoding, following the target head, autograd intact)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers.export import make_target_dir, train_and_checkpoint
from helpers.paths import DEMO_TARGET
from helpers.targets import make_tiny_qwen3
from safetensors import safe_open
from transformers import AutoTokenizer

from dspark_lightning.cli import cli_main
from dspark_lightning.data.tokenize import ConversationEncoder
from dspark_lightning.interop import export_checkpoint, load_exported
from dspark_lightning.lightning.module import load_draft_vocab
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from dspark_lightning.preparation import count_tokens, select_draft_vocab, special_token_ids

DEMO = str(DEMO_TARGET)


def test_selection_is_top_frequency_with_ties_to_lower_ids_and_forced_specials():
    counts = torch.tensor([0, 5, 3, 5, 9, 0, 1, 3])
    assert select_draft_vocab(counts, 4).d2t.tolist() == [1, 2, 3, 4]  # 9, 5, 5, then 3 (id 2 before id 7)
    assert select_draft_vocab(counts, 4, always_include=[5, 0]).d2t.tolist() == [0, 1, 4, 5]
    vocab = select_draft_vocab(counts, 7)  # more slots than seen tokens: unseen ids fill in, lowest first
    assert vocab.d2t.tolist() == [0, 1, 2, 3, 4, 6, 7] and vocab.t2d.tolist() == [True] * 5 + [False, True, True]
    with pytest.raises(ValueError, match="size"):
        select_draft_vocab(counts, 9)
    with pytest.raises(ValueError, match="too small for the 2 always-included ids"):
        select_draft_vocab(counts, 1, always_include=[0, 1])


def test_only_loss_masked_tokens_are_counted():
    batch = {
        "input_ids": torch.tensor([[1, 2, 2, 3], [3, 3, 0, 1]]),
        "loss_mask": torch.tensor([[0, 1, 1, 0], [1, 0, 0, 1]]),
    }
    assert count_tokens([batch, batch], 5).tolist() == [0, 2, 4, 2, 0]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        count_tokens([batch], 3)


def write_corpus(path: Path) -> list[list[dict]]:
    records, conversations = [], []
    for k in range(6):
        turns = [{"from": "human", "value": f"Question {k}?"}, {"from": "gpt", "value": f"Answer {k}: yes " * (k + 1)}]
        records.append(json.dumps({"id": str(k), "conversations": turns}))
        roles = {"human": "user", "gpt": "assistant"}
        conversations.append([{"role": roles[t["from"]], "content": t["value"]} for t in turns])
    path.write_text("\n".join(records) + "\n")
    return conversations


def test_cli_counts_assistant_tokens_and_writes_a_vocab_the_module_reads(tmp_path):
    conversations = write_corpus(tmp_path / "chats.jsonl")
    output = tmp_path / "vocab" / "draft_vocab.safetensors"
    summary = cli_main(
        [
            "draft-vocab",
            "--tokenizer",
            DEMO,
            "--data",
            str(tmp_path / "chats.jsonl"),
            "--size",
            "24",
            "--output",
            str(output),
        ]
    )

    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    encoder = ConversationEncoder(tokenizer)
    expected = Counter()
    for messages in conversations:
        encoded = encoder.encode(messages)
        expected.update(i for i, m in zip(encoded.input_ids, encoded.loss_mask) if m)
    with safe_open(str(output), "pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        metadata = f.metadata()
    counts = tensors["counts"]
    assert counts.shape == (2048,) and {i: int(c) for i, c in enumerate(counts.tolist()) if c} == dict(expected)
    specials = special_token_ids(tokenizer, 2048)
    assert specials == sorted({tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id})
    d2t = tensors["d2t"]
    assert d2t.dtype == torch.int64 and len(d2t) == 24 and torch.equal(d2t, d2t.sort().values)  # absolute, ascending
    assert set(specials) <= set(d2t.tolist())
    top = sorted(expected, key=lambda i: (-expected[i], i))[: 24 - len(set(specials) - set(expected))]
    assert set(top) <= set(d2t.tolist())
    assert torch.equal(tensors["t2d"].nonzero().flatten(), d2t)
    assert metadata["format"] == "dspark-lightning-draft-vocab" and summary["supervised_tokens"] == expected.total()
    assert summary["coverage"] == pytest.approx(sum(expected[i] for i in d2t.tolist()) / expected.total())
    assert torch.equal(load_draft_vocab(str(output), 2048).d2t, d2t)


def test_held_out_coverage_is_measured_on_data_the_selection_never_saw(tmp_path, capsys):
    write_corpus(tmp_path / "chats.jsonl")
    held = tmp_path / "held.jsonl"  # other words: part of the held-out tokens are outside the vocabulary
    turns = [{"from": "human", "value": "Why?"}, {"from": "gpt", "value": "Because the sky is blue, yes."}]
    held.write_text(json.dumps({"id": "h0", "conversations": turns}) + "\n")
    base = ["draft-vocab", "--tokenizer", DEMO, "--data", str(tmp_path / "chats.jsonl"), "--size", "24"]
    plain = cli_main([*base, "--output", str(tmp_path / "a.safetensors")])
    summary = cli_main([*base, "--output", str(tmp_path / "b.safetensors"), "--held_out", str(held)])

    d2t = load_draft_vocab(str(tmp_path / "b.safetensors"), 2048).d2t
    assert torch.equal(d2t, load_draft_vocab(str(tmp_path / "a.safetensors"), 2048).d2t)  # selection unchanged
    assert summary["coverage"] == plain["coverage"]
    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    encoded = ConversationEncoder(tokenizer).encode([{"role": "user", "content": "Why?"},
                                                     {"role": "assistant", "content": turns[1]["value"]}])  # fmt: skip
    supervised = [i for i, m in zip(encoded.input_ids, encoded.loss_mask) if m]
    inside = sum(i in set(d2t.tolist()) for i in supervised)
    assert summary["held_out_supervised_tokens"] == len(supervised)
    assert summary["held_out_coverage"] == pytest.approx(inside / len(supervised))
    assert 0 < inside < len(supervised)  # the case is not trivial
    assert "held-out coverage" in capsys.readouterr().out
    no_reply = tmp_path / "no_reply.jsonl"  # nothing to count: the error names the file and why
    no_reply.write_text(json.dumps({"id": "n", "conversations": [{"from": "human", "value": "Hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"(?s)--held_out.*no_reply\.jsonl: no_assistant_turn x1 \(first at line 1\)"):
        cli_main([*base, "--output", str(tmp_path / "c.safetensors"), "--held_out", str(no_reply)])


def test_a_draft_vocab_run_trains_and_exports(tmp_path):
    target_dir = make_target_dir(tmp_path / "target")
    vocab_path = tmp_path / "draft_vocab.safetensors"
    data = str(Path(DEMO).parent / "data" / "sharegpt" / "validation-00000.jsonl")
    cli_main(
        [
            "draft-vocab",
            "--tokenizer",
            str(target_dir),
            "--data",
            data,
            "--size",
            "300",
            "--output",
            str(vocab_path),
            "--max_rows",
            "8",
        ]
    )
    ckpt, module = train_and_checkpoint(
        tmp_path, target_dir, markov_head=MarkovHeadConfig(rank=8), draft_vocab=str(vocab_path)
    )
    drafter = module.drafter.eval()
    assert drafter.draft_vocab_size == 300 and drafter.markov_head.markov_w2.weight.shape == (300, 8)
    assert drafter.markov_head.markov_w2.weight.abs().sum() > 0  # it trained (W2 starts at zero)

    vocab_path.unlink()  # the export must not need the vocabulary file any more: the checkpoint holds d2t
    out = export_checkpoint(ckpt, tmp_path / "export", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 300 and config["transformer_layer_config"]["vocab_size"] == 2048
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("d2t") + torch.arange(300), drafter.d2t)
        assert f.get_tensor("lm_head.weight").shape == (300, 32)
    loaded = load_exported(out, str(target_dir))
    assert torch.equal(loaded.d2t, drafter.d2t) and loaded.draft_lm_head is None
    with torch.no_grad():
        h = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(0))
        prev = torch.randint(0, 2048, (3, 4), generator=torch.Generator().manual_seed(1))
        assert torch.equal(drafter.output_logits(h), loaded.output_logits(h))
        assert torch.equal(drafter.markov_head.block_bias(prev, h), loaded.markov_head.block_bias(prev, h))
        assert torch.equal(drafter.confidence_logits(h, prev), loaded.confidence_logits(h, prev))


def test_draft_head_rows_follow_the_target_head_and_keep_autograd():
    model = make_tiny_qwen3(vocab_size=32, seed=0)
    vocab = select_draft_vocab(torch.arange(32).flip(0) % 7, 8)
    drafter = DSparkDrafter.for_target(DrafterConfig(block_size=4, mask_token_id=31), FrozenTarget(model), vocab)
    hidden = torch.randn(2, 3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))

    def reference():
        return hidden.double() @ model.lm_head.weight.double()[vocab.d2t].T

    with torch.inference_mode():  # decoding: the gathered rows are reused ...
        assert torch.allclose(drafter.output_logits(hidden).double(), reference(), atol=1e-5)
        assert drafter._draft_head_rows() is drafter._draft_head_rows()
    with torch.no_grad():
        model.lm_head.weight.mul_(-2.0)  # ... until the target head changes in place (load_state_dict does)
        assert torch.allclose(drafter.output_logits(hidden).double(), reference(), atol=1e-5)
    hidden.requires_grad_(True)  # training after an inference-mode gather: a fresh one autograd can save
    drafter.output_logits(hidden).square().sum().backward()
    assert torch.allclose(hidden.grad.double(), (2 * reference() @ model.lm_head.weight.double()[vocab.d2t]), atol=1e-4)
