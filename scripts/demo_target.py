"""Tokenizer and tiny Qwen3 target for the demo assets: train, evaluate, pick a stable greedy sample.

Design choices:
- Byte-level BPE (``tokenizers``) trained on the rendered training conversations, so every byte is encodable and the
  chat markup tokenises compactly. Special tokens: ``<|endoftext|>`` (pad; also separates packed documents during
  target training), ``<|im_start|>``, ``<|im_end|>`` (eos; closes every turn) and ``<|mask|>`` (the drafter's mask
  token). The Qwen-style chat template wraps assistant content *and* its closing ``<|im_end|>`` in
  ``{% generation %}`` so the assistant mask teaches the drafter to stop.
- The target is a transformers ``Qwen3ForCausalLM`` (tied embeddings) trained with plain PyTorch on CPU: next-token
  loss on every token of conversations packed into fixed rows (separated by ``<|endoftext|>``), AdamW with warmup and
  cosine decay, a fixed number of optimizer steps, a seeded data order and a fixed thread count, so a rerun on the same software stack reproduces the weights.
- Validation perplexity is computed per conversation (no packing), over all tokens and over assistant tokens only.
- The stored expected generation is the validation prompt (among the first few) whose greedy continuation has the
  largest smallest top-1/top-2 logit margin, so the test that replays it is robust to last-bit float differences
  between CPUs.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, MASK_TOKEN]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ROLE_NAMES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


def to_messages(record: dict) -> list[dict[str, str]]:
    """ShareGPT turns of a (well-formed) demo record as chat-template messages."""
    return [{"role": ROLE_NAMES[t["from"]], "content": t["value"]} for t in record["conversations"]]


def render_text(messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The chat template above written in Python (used only to build the tokenizer's training text)."""
    parts = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
    return "".join(parts) + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE over ``texts`` wrapped as a transformers fast tokenizer with the chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """``save_pretrained`` plus a portable ``tokenizer_class`` (transformers 4.x and 5.x both load it)."""
    tokenizer.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for loader_detail in ("is_local", "local_files_only", "name_or_path"):  # facts about one load, not the tokenizer
        config.pop(loader_detail, None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def target_config(tokenizer: PreTrainedTokenizerFast, **overrides) -> Qwen3Config:
    """The demo target's architecture: a 4-layer Qwen3 with grouped-query attention and tied embeddings."""
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    settings.update(overrides)
    return Qwen3Config(**settings)


def pack_rows(documents: Sequence[list[int]], row_length: int, separator_id: int) -> torch.Tensor:
    """Concatenate documents (each followed by ``separator_id``) and cut the stream into full rows."""
    stream = [token for doc in documents for token in (*doc, separator_id)]
    num_rows = len(stream) // row_length
    return torch.tensor(stream[: num_rows * row_length], dtype=torch.long).view(num_rows, row_length)


def train_target(
    model: Qwen3ForCausalLM,
    documents: Sequence[list[int]],
    *,
    separator_id: int,
    row_length: int,
    batch_size: int,
    epochs: int,
    peak_lr: float,
    warmup_steps: int,
    seed: int,
    log_every: int = 25,
) -> list[dict]:
    """Next-token training on packed rows; the document order is reshuffled (seeded) every epoch."""
    rng = random.Random(seed)
    rows_per_epoch = len(pack_rows(documents, row_length, separator_id))
    total_steps = epochs * (rows_per_epoch // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return peak_lr * (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return peak_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    history = []
    step = 0
    start = time.time()
    model.train()
    for epoch in range(epochs):
        order = list(documents)
        rng.shuffle(order)
        rows = pack_rows(order, row_length, separator_id)
        for first in range(0, len(rows) - batch_size + 1, batch_size):
            batch = rows[first : first + batch_size]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % log_every == 0 or step == total_steps:
                entry = {"step": step, "epoch": epoch, "loss": round(loss.item(), 4), "seconds": time.time() - start}
                history.append(entry)
                print(f"  step {step}/{total_steps} epoch {epoch} loss {entry['loss']:.3f} ({entry['seconds']:.0f}s)")
    model.eval()
    return history


@torch.no_grad()
def validation_perplexity(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, conversations: Sequence[list[dict[str, str]]]
) -> dict[str, float]:
    """Perplexity over all predicted tokens and over assistant tokens only (one conversation at a time)."""
    total_nll = assistant_nll = 0.0
    total_count = assistant_count = 0
    for messages in conversations:
        encoded = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        ids = torch.tensor([encoded["input_ids"]])
        assistant = torch.tensor(encoded["assistant_masks"][1:], dtype=torch.bool)
        logits = model(input_ids=ids).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        total_nll += nll.sum().item()
        total_count += nll.numel()
        assistant_nll += nll[assistant].sum().item()
        assistant_count += int(assistant.sum())
    return {
        "perplexity_all_tokens": math.exp(total_nll / total_count),
        "perplexity_assistant_tokens": math.exp(assistant_nll / assistant_count),
        "num_conversations": len(conversations),
        "num_tokens": total_count,
        "num_assistant_tokens": assistant_count,
    }


@torch.no_grad()
def greedy_with_margin(model: Qwen3ForCausalLM, prompt_ids: list[int], max_new_tokens: int, eos_id: int):
    """Greedy continuation (no cache, so it is the plainest possible reference) and its smallest top-2 margin."""
    ids = list(prompt_ids)
    generated: list[int] = []
    smallest_margin = float("inf")
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        smallest_margin = min(smallest_margin, (top2.values[0] - top2.values[1]).item())
        token = int(top2.indices[0])
        generated.append(token)
        ids.append(token)
        if token == eos_id:
            break
    return generated, smallest_margin


def choose_expected_generation(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    records: Sequence[dict],
    max_new_tokens: int,
    candidates: int = 12,
) -> dict:
    """The first-assistant-turn prompt (among the first ``candidates`` records) with the most robust greedy path."""
    best = None
    for record in records[:candidates]:
        messages = to_messages(record)
        first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompt_messages = messages[:first_assistant]
        prompt_ids = tokenizer.apply_chat_template(prompt_messages, add_generation_prompt=True, return_dict=False)
        generated, margin = greedy_with_margin(model, prompt_ids, max_new_tokens, tokenizer.eos_token_id)
        if best is None or margin > best["min_top2_logit_margin"]:
            best = {
                "conversation_id": record["id"],
                "prompt_messages": prompt_messages,
                "prompt_ids": prompt_ids,
                "max_new_tokens": max_new_tokens,
                "generated_ids": generated,
                "generated_text": tokenizer.decode(generated, skip_special_tokens=True),
                "reference_answer": messages[first_assistant]["content"],
                "min_top2_logit_margin": round(margin, 4),
            }
    return best
