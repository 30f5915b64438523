"""``regenerate --temperature/--top_p/--top_k/--seed``: sampled replies (DeepSpec's recipe) instead of greedy ones."""

from __future__ import annotations

import json

import pytest
from helpers.paths import DEMO_TARGET, ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_lightning.errors import OptionError
from dspark_lightning.preparation.regenerate import regenerate

VALIDATION = ROOT / "assets/data/sharegpt/validation-00000.jsonl"


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(DEMO_TARGET).eval(), AutoTokenizer.from_pretrained(DEMO_TARGET)


def replies(directory) -> list[str]:
    records = [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]
    return [turn["value"] for record in records for turn in record["conversations"] if turn["from"] == "gpt"]


def test_sampling_draws_other_replies_than_greedy_and_the_same_with_the_same_seed(tmp_path, target):
    model, tokenizer = target
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(VALIDATION.read_text().splitlines()[:3]) + "\n")
    kwargs = dict(model=model, tokenizer=tokenizer, max_new_tokens=16, max_turns=1)
    greedy = regenerate(str(DEMO_TARGET), str(data), tmp_path / "greedy", **kwargs)
    sampled = regenerate(str(DEMO_TARGET), str(data), tmp_path / "a", temperature=1.5, top_k=50, seed=3, **kwargs)
    again = regenerate(str(DEMO_TARGET), str(data), tmp_path / "b", temperature=1.5, top_k=50, seed=3, **kwargs)
    assert greedy["sampling"] == "greedy" and sampled["sampling"] == {"temperature": 1.5, "top_p": 1.0, "top_k": 50,
                                                                      "seed": 3}  # fmt: skip
    assert replies(tmp_path / "a") != replies(tmp_path / "greedy")  # the option is not ignored
    assert replies(tmp_path / "a") == replies(tmp_path / "b")  # reproducible with its seed
    assert len(replies(tmp_path / "a")) == len(replies(tmp_path / "greedy")) == again["records_after"]


@pytest.mark.parametrize(
    ("options", "named"),
    [({"temperature": -1.0}, "--temperature"), ({"temperature": 0.7, "top_p": 0.0}, "--top_p"),
     ({"temperature": 0.7, "top_k": -1}, "--top_k"), ({"top_p": 0.8}, "--top_p and --top_k")],
)  # fmt: skip
def test_sampling_options_out_of_range_are_refused_naming_them(tmp_path, options, named):
    with pytest.raises(OptionError, match=named):
        regenerate(str(DEMO_TARGET), str(VALIDATION), tmp_path / "out", **options)
