"""SIGTERM is honoured while a validation-time callback decodes: a real ``fit`` process stops between prompts.

A fit under ``timeout`` used to log "Received SIGTERM" and then run for a quarter of an hour inside
``SpeculativeDecodingCallback``: Lightning only sets ``trainer.received_sigterm`` and stops at the next batch, which a
long epoch-end hook delays by its whole run. Here the callback is given far more decoding than the deadline allows
(every mode, many prompts, many tokens), the signal is sent once its start line is printed, and the callback must
report that it skipped the rest of its decode; the validation then ends as usual, so ``last.ckpt`` holds the step it
stopped at and the run can be resumed from it. ``HANG_GUARD_S`` only turns the old quarter-hour run into a failure
instead of a blocked suite; nothing here measures time.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import torch
from helpers.paths import ROOT
from helpers.quickstart import quickstart_fit_args

HANG_GUARD_S = 120  # from the signal to the exit (the whole decode asked for would take many minutes)
START_S = 600  # from the launch to the decode's start line (loading, 4 training steps): generous, a loaded machine


def test_sigterm_during_the_decoding_callback_stops_the_fit_between_prompts(tmp_path):
    decode = {
        "class_path": "dspark_lightning.measuring.callback.SpeculativeDecodingCallback",
        "init_args": {"modes": ["parallel", "markov", "selector"], "num_prompts": 48, "max_new_tokens": 512},
    }
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}
    command = [
        sys.executable, "-m", "dspark_lightning",
        *quickstart_fit_args(ROOT / "assets/data/sharegpt/validation-*.jsonl"),
        "--data.seq_len=128", "--data.batch_size=2", "--data.limit_val_samples=8", "--data.num_eval_prompts=48",
        "--model.drafter.max_anchors=8", "--trainer.max_steps=8", "--trainer.val_check_interval=4",
        "--trainer.limit_val_batches=1", f"--trainer.callbacks={json.dumps([checkpoint, decode])}",
        "--trainer.enable_progress_bar=false", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}", "--trainer.logger.name=run",
    ]  # fmt: skip
    environment = os.environ | {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        started = time.monotonic()
        while not any("SpeculativeDecodingCallback: decoding" in line for line in output):
            line = lines.get(timeout=max(1.0, START_S - (time.monotonic() - started)))
            assert line is not None, "fit ended before the decoding callback started:\n" + "".join(output)
            output.append(line)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {HANG_GUARD_S} s after SIGTERM:\n" + "".join(output)) from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    while (line := lines.get(timeout=10)) is not None:
        output.append(line)
    text = "".join(output)
    assert "SpeculativeDecodingCallback: stopped on SIGTERM, the rest of this decode is skipped" in text, text
    # the validation ended normally before the loop stopped: the last checkpoint is at the step it stopped at
    checkpoint = torch.load(tmp_path / "run/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 4
