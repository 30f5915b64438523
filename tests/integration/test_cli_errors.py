"""Usage errors are short and helpful: one error line (with "did you mean" for a misspelt option or command) and
one usage line, for the tool commands and for ``fit``, instead of jsonargparse's whole usage (110 lines for fit)."""

from __future__ import annotations

import pytest
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main, main
from dspark_lightning.data.datamodule import ShareGPTDataModule
from dspark_lightning.errors import OptionError


def usage_error(args: list[str], capsys) -> list[str]:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_misspelt_tool_option_is_one_line_with_a_suggestion(capsys):
    lines = usage_error(["decode", "--ckpt_pth", "runs/x/last.ckpt"], capsys)
    assert lines == [
        "usage: dspark-lightning decode [options]   (dspark-lightning decode --help lists them)",
        "dspark-lightning decode: error: unrecognized arguments: --ckpt_pth runs/x/last.ckpt "
        "(did you mean --ckpt_path?)",
    ]


def test_misspelt_fit_options_are_named_with_their_suggestions(capsys):
    args = ["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.max_stepz", "3"]
    lines = usage_error([*args, "--modle.drafter.block_size=4"], capsys)
    assert len(lines) == 2 and lines[0].startswith("usage: dspark-lightning fit [options]")
    assert lines[1].endswith("(did you mean --trainer.max_steps / --model.drafter.block_size?)")


def test_a_misspelt_command_and_a_bad_value_stay_short(capsys):
    lines = usage_error(["decod"], capsys)
    assert len(lines) == 2 and "invalid choice: 'decod'" in lines[1] and lines[1].endswith("(did you mean decode?)")
    lines = usage_error(["decode", "--ckpt_path", "x", "--k", "abc"], capsys)  # not a misspelling: no suggestion
    assert lines[0].startswith("usage: dspark-lightning decode") and 'Parser key "k"' in lines[1]
    assert "did you mean" not in "\n".join(lines) and len(lines) <= 4


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("--model.drafter.block_size=1", "model.drafter.block_size must be >= 2, got 1"),
        ("--model.drafter.num_layers=0", "model.drafter.num_layers must be >= 1, got 0"),
        ("--model.drafter.max_anchors=0", "model.drafter.max_anchors must be >= 1, got 0"),
        ("--model.drafter.sliding_window=0", "model.drafter.sliding_window must be >= 1"),
        ("--model.drafter.markov_head.rank=0", "model.drafter.confidence_with_markov=true needs a Markov head"),
    ],
)
def test_a_bad_model_option_is_one_line_naming_it(option, expected, monkeypatch, capsys):
    monkeypatch.setattr(
        "sys.argv", ["dspark-lightning", "fit", "--config", str(ROOT / "configs/quickstart.yaml"), option]
    )
    assert main() == 2  # refused while the model is built, before any training step
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"dspark-lightning: error: {expected}"), line


@pytest.mark.parametrize("option", ["seq_len=0", "batch_size=0", "num_workers=-1", "shuffle_buffer=-1"])
def test_a_bad_data_size_is_a_usage_error_in_the_cli_and_an_option_error_in_python(option, capsys):
    name, value = option.split("=")
    lines = usage_error(["fit", "--config", str(ROOT / "configs/quickstart.yaml"), f"--data.{option}"], capsys)
    assert f'Parser key "data.{name}"' in "\n".join(lines)
    with pytest.raises(OptionError, match=rf"data\.{name} must be at least \d, got {value}"):
        ShareGPTDataModule("unused-tokenizer", **{name: int(value)})
