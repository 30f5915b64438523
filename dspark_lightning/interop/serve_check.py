"""``serve-check``: vLLM and this project's loop on the same token ids, greedy; outputs, counts per slot and tau
(accepted + 1 per step, and speculators' EAL without the bonus token) compared, and vLLM's own drafter class loaded
from the export with every tensor checked. vLLM runs in its own interpreter (``--vllm_python`` / ``DSPARK_VLLM_PYTHON``)
as a subprocess (``vllm_worker.py``); where it cannot run the method here (``dspark`` needs a GPU), serving is skipped
in one line and the load check still runs. How to read it: docs/guides/serve_with_vllm.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

import torch

from dspark_lightning.decoding.loop import speculative_generate
from dspark_lightning.errors import OptionError, UserError
from dspark_lightning.interop.speculators_format import CONFIG_NAME
from dspark_lightning.interop.speculators_load import load_exported
from dspark_lightning.interop.support_matrix import FORMAT_ENGINE, head_kind, support

WORKER = Path(__file__).with_name("vllm_worker.py")
DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Speculative decoding works by")


class ServeCheckFailed(UserError):
    """The engine and this project disagree (outputs or counts), or the engine could not load the export."""


def vllm_interpreter(vllm_python: str | None) -> str:
    python = vllm_python or os.environ.get("DSPARK_VLLM_PYTHON")
    if not python:
        raise OptionError(
            "--vllm_python: serve-check needs a Python interpreter with vLLM installed (or DSPARK_VLLM_PYTHON); "
            "docs/guides/serve_with_vllm.md creates one"
        )
    if not Path(python).is_file():
        raise OptionError(f"--vllm_python {python!r}: no such interpreter")
    return python


def run_worker(python: str, job: dict, workdir: Path, timeout: int) -> dict:
    """One ``vllm_worker.py`` task in a fresh process; its log is kept in ``workdir``."""
    name = job.get("name", job["task"])  # a task run twice (serve-speedup's time: with and without the drafter)
    job = job | {"result": str(workdir / f"{name}.json")}
    (workdir / f"{name}-job.json").write_text(json.dumps(job))
    log = workdir / f"{name}.log"
    with log.open("w") as out:
        command = [python, str(WORKER), str(workdir / f"{name}-job.json")]
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    result = workdir / f"{name}.json"
    if not result.is_file():
        raise ServeCheckFailed(f"the vLLM worker ({job['task']}) exited with status {status.returncode}: see {log}")
    return json.loads(result.read_text()) | {"log": str(log)}


def slot_counts(accepted_per_step: list[int], verified_per_step: list[int], slots: int) -> tuple[list, list]:
    """(drafted, accepted) per slot: drafts that reached slot k, and drafts whose slot k was accepted."""
    drafted = [sum(v > k for v in verified_per_step) for k in range(slots)]
    accepted = [sum(a > k for a in accepted_per_step) for k in range(slots)]
    return drafted, accepted


def counts_line(name: str, drafts: int, drafted: list[int], accepted: list[int]) -> str:
    total = sum(accepted)
    tau, eal = (1 + total / drafts, total / drafts) if drafts else (math.nan, math.nan)
    return (
        f"  {name:<17} drafts {drafts:>5}  drafted {sum(drafted):>6}  accepted {total:>5}  accepted per slot "
        f"{accepted}  tau (accepted+1) {tau:.3f}  EAL (no bonus) {eal:.3f}"
    )


def load_line(load: dict) -> str:
    if "error" in load:
        return f"load check: {load.get('class', 'vLLM')} refused the export: {load['error']}"
    ok = not load["differ"] and not load["unused"] and not load["not_from_export"]
    shared = ", ".join(load["from_verifier"]) or "none"
    detail = (
        f"{load['compared']} parameters compared, all equal to the export's tensors; from the verifier: {shared}"
        if ok
        else f"differ {load['differ']}, export tensors unused {load['unused']}, not loaded {load['not_from_export']}"
    )
    return f"load check: vLLM's {load['class']} ({load['architecture']}) built from the export: {detail}"


def our_side(export: str, target: str, prompts: list[list[int]], max_new_tokens: int, device: str) -> dict:
    """This project's decoding loop on the export as ``load_exported`` reads it: outputs and per-step counts."""
    drafter, frozen = load_exported(export, target, return_target=True)
    frozen.model.to(device)
    drafter.to(device)
    mode = "markov" if drafter.markov_head is not None else "parallel"
    outputs, accepted, verified = [], [], []
    for ids in prompts:
        prompt = torch.tensor([ids], device=device)
        tokens, stats = speculative_generate(frozen, drafter, prompt, max_new_tokens, mode=mode, eos_token_id=[])
        outputs.append(tokens[0, len(ids) :].tolist())
        accepted += stats.accepted_per_step
        verified += stats.verified_per_step
    return {"outputs": outputs, "accepted": accepted, "verified": verified}


def serve_check_command(
    export: str,
    target: str,
    prompts: list[str] | None = None,
    max_new_tokens: int = 64,
    vllm_python: str | None = None,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    memory_fraction: float = 0.1,
    timeout: int = 1200,
) -> dict:
    """Serve an export with vLLM and with this project's decoding loop (greedy): outputs, counts, load check.

    Args:
        export: the export directory (``dspark-lightning export``)
        target: the verifier (its directory or hub id; vLLM's ``model``)
        prompts: prompt strings, tokenized with the target's tokenizer (default: three short ones)
        max_new_tokens: tokens generated per prompt (end-of-sequence ignored on both sides)
        vllm_python: a Python interpreter with vLLM (default: $DSPARK_VLLM_PYTHON)
        device: where this project's loop runs: cpu, cuda or auto (cuda when there is one); vLLM serves the dspark
            method only with cuda
        memory_fraction: vLLM's gpu_memory_utilization (on CPU: the share of host memory it reserves)
        timeout: seconds each vLLM process may run
    """
    from transformers import AutoTokenizer

    python = vllm_interpreter(vllm_python)
    config = json.loads((Path(export) / CONFIG_NAME).read_text())
    method, head = config.get("speculators_model_type"), head_kind(config)
    if method not in FORMAT_ENGINE:
        raise OptionError(
            f"--export {export}: speculators_model_type {method!r}; expected one of {list(FORMAT_ENGINE)}"
        )
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    texts = list(prompts or DEFAULT_PROMPTS)
    ids = [AutoTokenizer.from_pretrained(target)(text)["input_ids"] for text in texts]
    tokens = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    job = dict(export=str(export), target=str(target), method=method, num_tokens=tokens, dtype="float32")
    job |= dict(max_model_len=max(map(len, ids)) + max_new_tokens + 2 * config["block_size"] + 16)
    verdict = support(FORMAT_ENGINE[method], head)
    print(
        f"serve-check: {export} ({method} format, {head} head; support matrix: "
        + ", ".join(f"vLLM {v} {'serves it' if s.servable else 'does not serve it'}" for v, s in verdict.items())
        + f"), {len(texts)} prompts x {max_new_tokens} tokens, greedy"
    )
    result = {"method": method, "head": head}
    with tempfile.TemporaryDirectory(prefix="serve-check.") as tmp:
        workdir = Path(tmp)
        load = result["load"] = run_worker(python, job | {"task": "load"}, workdir, timeout)
        print(load_line(load))
        load_ok = "error" not in load and not (load["differ"] or load["unused"] or load["not_from_export"])
        if method == "dspark" and device != "cuda":
            print("serving: skipped: vLLM runs the dspark method only in Model Runner V2, which needs a GPU (Triton)")
            result["served"] = False
        else:
            served = run_worker(python, job | {"task": "serve", "prompts": ids, "max_new_tokens": max_new_tokens,
                                               "memory_fraction": memory_fraction}, workdir, timeout)  # fmt: skip
            if "error" in served:
                raise ServeCheckFailed(f"vLLM could not serve the export: {served['error']} (log: {served['log']})")
            result |= compare(served, our_side(export, target, ids, max_new_tokens, device), tokens)
    if not load_ok or result.get("equal") is False:
        raise ServeCheckFailed(
            "serve-check failed: " + ("the load check" if not load_ok else "outputs or counts differ")
        )
    return result


def compare(served: dict, ours: dict, slots: int) -> dict:
    """Print and return the comparison of vLLM's run (``served``) and ours on the same prompts."""
    same = [a == b for a, b in zip(served["outputs"], ours["outputs"])]
    print(f"outputs: {'equal' if all(same) else 'DIFFERENT'} on {sum(same)}/{len(same)} prompts")
    counters = served["counters"]
    vllm_accepted = list(counters.get("num_accepted_tokens_per_pos", []))
    vllm_drafted = [counters.get("num_drafts", 0)] * len(vllm_accepted)
    our_drafted, our_accepted = slot_counts(ours["accepted"], ours["verified"], slots)
    print(counts_line("vLLM", counters.get("num_drafts", 0), vllm_drafted, vllm_accepted))
    print(counts_line("dspark-lightning", len(ours["verified"]), our_drafted, our_accepted))
    counts = (counters.get("num_drafts"), counters.get("num_draft_tokens"), vllm_accepted)
    equal_counts = counts == (len(ours["verified"]), sum(our_drafted), our_accepted)
    print(f"counts: {'equal' if equal_counts else 'DIFFERENT'}")
    return {
        "served": True,
        "outputs_equal": all(same),
        "counts_equal": equal_counts,
        "equal": all(same) and equal_counts,
        "vllm": {"drafts": counts[0], "drafted": counts[1], "accepted_per_slot": vllm_accepted},
        "ours": {"drafts": len(ours["verified"]), "drafted": sum(our_drafted), "accepted_per_slot": our_accepted},
    }
