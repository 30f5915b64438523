"""The Gemma 3 recipe (``configs/recipes/gemma3.yaml`` + ``configs/gemma3_completion.yaml``) at tiny scale: the same
generic ``report-recipe`` as SmolLM2's, on a base model without a chat template (completion records, plain-text
eval prompts). The real Gemma 3 270M is swapped for a tiny random Gemma 3 (sliding-window layers, scaled embeddings)
over the demo tokenizer without its chat template; the shipped regenerated Gemma continuations are its data."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.paths import DEMO_TARGET, ROOT
from helpers.recipes import require_recipe_packages
from helpers.targets import make_tiny_gemma3

from dspark_lightning.cli import cli_main
from dspark_lightning.data.formats import has_chat_template
from dspark_lightning.errors import OptionError
from dspark_lightning.measuring.results import EvalSetRow, SpeedupResult, from_json
from dspark_lightning.studies.recipes import load_recipe

SHIPPED = ROOT / "assets/gemma3/regenerated"
LAYERS = "[1,3]"


@pytest.fixture(scope="module")
def base_target(tmp_path_factory):
    """A tiny Gemma 3 saved with the demo tokenizer but no chat template: a base model, as Gemma 3 270M is."""
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("gemma3_base")
    make_tiny_gemma3(vocab_size=2048, sliding_window=16).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_TARGET / name, directory / name)
    assert not has_chat_template(AutoTokenizer.from_pretrained(directory))
    return directory


def test_the_recipe_names_its_fit_config_and_the_head_less_drafter_with_two_markov_heads():
    recipe = load_recipe("gemma3")
    assert (ROOT / recipe.fit_config).is_file() and recipe.heads[0] == "none" and len(recipe.heads) >= 3
    import yaml

    fit = yaml.safe_load((ROOT / recipe.fit_config).read_text())
    assert fit["data"]["format"] == "completion"  # no chat template is invented for a base model
    assert fit["model"]["drafter"]["markov_head"]["kind"] == recipe.default_head
    assert (ROOT / fit["model"]["drafter"]["draft_vocab"]).is_file()  # a shipped input, in the repository
    assert sorted(p.name for p in SHIPPED.glob("*.jsonl")) == ["train-00000.jsonl", "validation-00000.jsonl"]
    for line in (SHIPPED / "validation-00000.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert set(record) == {"id", "prompt", "completion"} and record["completion"].strip()


def test_the_generic_recipe_report_runs_on_a_base_gemma3(base_target, tmp_path):
    require_recipe_packages()  # sharegpt_heldout reads the real ShareGPT V3 file, as the recipe says
    data = str(SHIPPED / "validation-00000.jsonl")
    cache = tmp_path / "cache"
    summary = cli_main(
        ["cache", "--target", str(base_target), "--data", data, "--output", str(cache), "--seq_len", "256"]
        + ["--batch_size", "1", "--layers", LAYERS, "--limit", "2", "--device", "cpu", "--format", "completion"]
    )
    assert summary["complete"]
    fit_args = [f"--model.target.path={base_target}", "--data.seq_len=256", f"--data.train_cache={cache}"]
    fit_args += [f"--data.val_cache={cache}", f"--data.val_files={data}", "--model.drafter.max_anchors=8"]
    fit_args += [f"--model.drafter.target_layer_ids={LAYERS}", "--model.drafter.draft_vocab=null"]
    fit_args += ["--trainer.limit_val_batches=1"]
    rows = cli_main(
        ["report-recipe", "--recipe", "gemma3", "--output", str(tmp_path / "report"), "--heads", "[none,gated]"]
        + ["--steps", "2", "--num_prompts", "2", "--max_new_tokens", "8", "--max_blocks", "16"]
        + ["--runs_dir", str(tmp_path / "runs"), "--fit_args", json.dumps(fit_args)]
        + ["--eval_sets", "[sharegpt_heldout,humaneval]", "--eval_set_limit", "1", "--eval_max_new_tokens", "6"]
    )
    assert [(r["head"], r["block_size"]) for r in rows] == [("none", 8), ("gated", 8)]
    for row in rows:
        timed = from_json(SpeedupResult, row["wall_clock"]).comparison
        assert timed.outputs_equal and 1.0 <= row["measured_tau"] <= 9.0
        assert row["speedup"] == timed.speedup > 0  # the per-head row: head, B, tau, speedup
        sets = [from_json(EvalSetRow, e).summary for e in row["eval_sets"]]
        assert [s.eval_set for s in sets] == ["sharegpt_heldout", "humaneval"]
        assert all(s.outputs_equal and s.speedup > 0 for s in sets)
    # the runs saved the data format they trained with (a base model: completion, chosen in the fit config)
    saved = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("data_format.json")]
    assert len(saved) == 2 and all(s["format"] == "completion" for s in saved)
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["command"].startswith("dspark-lightning report-recipe --recipe gemma3")
    # decoding the head-less drafter in a mode only a Markov head has measures nothing: a clear error, not 0 rows
    (none_ckpt,) = (tmp_path / "runs" / "none").rglob("last.ckpt")
    with pytest.raises(OptionError, match=r"--modes \['markov'\]: the drafter \(no Markov head\) supports only"):
        cli_main(["decode", "--ckpt_path", str(none_ckpt), "--modes", "[markov]", "--num_prompts", "1"])
