"""Which records become evaluation prompts: the first ``count`` in order whose prompt is shorter than ``seq_len``
tokens, and with an id split only those of its validation split (never train or test)."""

from __future__ import annotations

from types import SimpleNamespace

from dspark_lightning.data.prompts import choose_eval_conversations
from dspark_lightning.data.splits import IdSplit


class LengthEncoder:
    """A prompt of ``example.length`` tokens (None: the record has no prompt)."""

    def example_prompt_ids(self, example):
        return None if example.length is None else [1] * example.length


def examples(lengths, prefix: str = "id"):
    return [SimpleNamespace(record_id=f"{prefix}{i}", length=n) for i, n in enumerate(lengths)]


def test_the_first_prompts_shorter_than_seq_len_in_order():
    records = examples([3, 8, None, 7, 9, 2, 1])
    chosen = choose_eval_conversations(records, 3, LengthEncoder(), seq_len=8)
    assert [r.record_id for r in chosen] == ["id0", "id3", "id5"]  # 8 and 9 are not shorter than 8; id2 has none
    assert len(choose_eval_conversations(records, 10, LengthEncoder(), seq_len=8)) == 4


def test_with_an_id_split_only_validation_records_are_chosen():
    split = IdSplit(validation=0.3, test=0.3)
    records = examples([1] * 300)
    chosen = choose_eval_conversations(records, 300, LengthEncoder(), seq_len=8, id_split=split)
    expected = [r.record_id for r in records if split.split_of(r.record_id) == "validation"]
    assert [r.record_id for r in chosen] == expected and 60 < len(expected) < 120
