"""Multi-turn prompts (``measuring/turns.py``): turn 2's input is the chat template over turn 1, the target's own
reply and turn 2, built here by hand; every measuring loop conditions on the target's reply, not on anything else."""

from __future__ import annotations

import pytest
import torch
from helpers.paths import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_lightning.data.tokenize import ConversationEncoder
from dspark_lightning.measuring import tables
from dspark_lightning.measuring.eval_sets import EvalSet, prompt_token_ids
from dspark_lightning.measuring.turns import Conversation, decode_turns, first_turn_ids
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget

DEMO = ROOT / "assets/demo-target"
QUESTION = [{"role": "user", "content": "Name a colour."}]
FOLLOW_UP = "Now name a fruit of that colour."


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO)


def hand_built(tokenizer, reply_text: str) -> list[int]:
    """What the field's MT-Bench runner sends for turn 2: both user turns and the reply, through the template."""
    messages = [*QUESTION, {"role": "assistant", "content": reply_text}, {"role": "user", "content": FOLLOW_UP}]
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def test_turn_two_is_the_template_over_turn_one_the_reply_and_turn_two(tokenizer):
    conversation = Conversation(QUESTION, [FOLLOW_UP], ConversationEncoder(tokenizer))
    assert conversation.turns == 2
    reply = tokenizer("Blue, mostly.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert first_turn_ids(conversation) == list(
        tokenizer.apply_chat_template(QUESTION, tokenize=True, add_generation_prompt=True, return_dict=False)
    )
    assert conversation.turn_ids([reply]) == hand_built(tokenizer, "Blue, mostly.")  # the end token is not text
    with pytest.raises(ValueError, match="has no turn 3"):
        conversation.turn_ids([reply, reply])
    seen = []
    results = decode_turns(conversation, lambda ids: (seen.append(ids) or len(seen), reply))
    assert results == [1, 2] and seen == [first_turn_ids(conversation), hand_built(tokenizer, "Blue, mostly.")]
    assert decode_turns([5, 6, 7], lambda ids: (ids, [9])) == [[5, 6, 7]]  # one turn: the ids themselves


def test_an_eval_set_with_later_turns_becomes_conversations_only_where_it_has_them(tokenizer):
    loaded = EvalSet("mine", [QUESTION, QUESTION], "test", "chat", ["a", "b"], follow_ups=[[FOLLOW_UP], []])
    multi, single = prompt_token_ids(loaded, tokenizer)
    assert isinstance(multi, Conversation) and multi.follow_ups == [FOLLOW_UP]
    assert single == first_turn_ids(multi)
    assert loaded.describe()["turns"] == 3
    with pytest.raises(ValueError, match="1 follow-ups for 2 prompts"):
        EvalSet("bad", [QUESTION, QUESTION], "test", "chat", ["a", "b"], follow_ups=[[FOLLOW_UP]])


def test_the_decode_loop_sends_turn_two_after_the_targets_own_greedy_reply(tokenizer, monkeypatch):
    torch.manual_seed(0)
    target = FrozenTarget(AutoModelForCausalLM.from_pretrained(DEMO).eval(), num_draft_layers=1)
    config = DrafterConfig(block_size=4, num_layers=1, max_anchors=4, mask_token_id=tokenizer.eos_token_id)
    drafter = DSparkDrafter.for_target(config, target).eval()  # untrained: every draft is a guess, still lossless
    conversation = Conversation(QUESTION, [FOLLOW_UP], ConversationEncoder(tokenizer))
    sent, real = [], tables.speculative_generate

    def recording(target_, drafter_, ids, *args, **kwargs):
        sent.append(ids[0].tolist())
        return real(target_, drafter_, ids, *args, **kwargs)

    monkeypatch.setattr(tables, "speculative_generate", recording)
    module = type("Module", (), {"target": target, "drafter": drafter})()
    (row,) = tables.decode_table(module, [conversation], ["parallel"], 0.0, [None], 12, 4)
    first = first_turn_ids(conversation)
    with torch.no_grad():  # the target's own greedy reply, by generate: independent of the speculative loop
        generated = target.model.generate(torch.tensor([first]), max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(generated[0, len(first) :], skip_special_tokens=True)
    assert sent == [first, hand_built(tokenizer, reply)]
    (record,) = row.prompt_records  # one question, both turns pooled into its record
    assert record.emitted_tokens > 12 and row.prompts_without_verify == 0
