"""Training step (forward + backward + optimizer) of our drafter vs the public ``speculators`` DSpark, same config.

Run: ``python -m benchmarks.training.step_vs_speculators`` (1.5-3 minutes on 2 shared cores, plus about a minute the first time
to create the reference venv) or ``--quick`` (a tiny config, 20-30 s). Writes ``train_step.csv`` / ``.md``
(``--quick``: ``train_step_quick.*``) under ``benchmarks/training/results``.

Design choices:
- The reference is ``speculators`` (vllm-project/speculators) from PyPI, installed in a throw-away venv
  (``--reference-venv``, default ``/tmp/specvenv``) by this script when absent: ``python -m venv``, ``pip install -c
  constraints-cpu.txt speculators``, ``pip uninstall -y torchvision torchaudio`` (their CPU imports break otherwise).
  It is never a dependency of this project and none of its code is copied: ``_speculators_driver.py`` runs under that
  venv's python and calls its public training API. If the venv cannot be made, the results say so and still give our
  numbers.
- Both sides get the same synthetic inputs from one safetensors file (random target hidden states at 2 target layers
  and the final hidden state, random token ids, 4 packed documents with a 25 % prompt each outside the loss mask) and
  the same synthetic Qwen3 target directory (random weights; its embedding and LM head are the frozen input/output
  layers of both drafters). Target features are precomputed on both sides: the reference trains from offline
  hidden states, and our ``DSparkModule.shared_step`` takes them from the batch (its offline-cache path).
- Same model config: draft layers, hidden size, heads, block size B, anchors A, Markov rank and head type, confidence
  head reading the Markov embedding, loss ``{"ce": 0.1, "tv": 0.9}`` with exp(-k/4) position weights (theirs: their
  *eager* losses, the non-Triton implementation), AdamW (lr 6e-4, betas 0.9/0.95, no weight decay), grad-norm clip
  1.0, fp32 (``--precision bf16``: both forwards under bf16 autocast, what ``bf16-mixed`` runs; files
  ``train_step_bf16*``), no ``torch.compile`` (theirs compiles only on CUDA). Attention: ours ``sdpa`` with a dense boolean mask
  (our CPU default); theirs ``sdpa`` (``draft_attn_impl``; their default FlexAttention has no CPU backward, and their
  ``eager`` was slower in a trial). The trainable parameter counts of both sides are reported as a check.
- Our step = ``DSparkModule.shared_step`` (drafter forward, chunked compound loss, confidence BCE) + the
  ``AcceptanceMetrics`` update that ``training_step`` logs; theirs = ``model(**batch)`` (loss and their metrics).
- Huge pages: both workers run with PyTorch's huge-page allocation (``THP_MEM_ALLOC_ENABLE=1``, which our command
  line turns on and speculators does not), so the ratio compares the implementations under one allocator setting;
  ``--huge-pages ours`` gives each side its own default, ``none`` neither (files ``*_thp_ours``, ``*_thp_none``).
- One thread on both sides (``torch.set_num_threads`` and ``OMP_NUM_THREADS``): the machine has 2 cores shared with
  other jobs, and oversubscribed OpenMP threads make timings of small ops erratic.
- Alternation: both sides run as persistent warm worker processes; after warm-up the parent alternates batches of
  timed steps (ours, theirs, theirs, ours, ...), only one worker running at a time, so load from other processes hits
  both alike. Reported: the median step time over all timed steps of each side (and per-phase medians: forward incl.
  loss/metrics, backward incl. clip, optimizer), the ratio ours/theirs of the medians, the median of the per-round
  ratios (each round's two batches run back to back, so it is less exposed to load drift), minima, and each
  worker's peak resident memory (VmHWM, includes model, optimizer state and inputs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
DRIVER = Path(__file__).resolve().parent / "_speculators_driver.py"
DEFAULT_VENV = Path("/tmp/specvenv")
LOSS = {"ce": 0.1, "tv": 0.9}
# which workers get PyTorch's huge-page allocation (THP_MEM_ALLOC_ENABLE=1, dspark_lightning/huge_pages.py): ``both``
# compares the implementations under one allocator setting; ``ours`` compares each as it runs by default (our command
# line turns it on, speculators does not); ``none`` turns it off for both
HUGE_PAGES = {"both": ("ours", "theirs"), "ours": ("ours",), "none": ()}  # option: the sides that get them

# fmt: off
_BASE = dict(hidden=256, heads=8, kv_heads=4, head_dim=32, intermediate=768, target_layers=4, num_layers=2,
             target_layer_ids=[1, 2], vocab=16384, seq_len=1024, docs=4, markov_rank=128)
CONFIGS = {
    "vanilla-B8": {**_BASE, "block_size": 8, "max_anchors": 128, "markov_kind": "vanilla"},
    "gated-B16": {**_BASE, "block_size": 16, "max_anchors": 64, "markov_kind": "gated"},
}
QUICK_CONFIG = {
    "tiny": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, target_layers=2, num_layers=1,
                 target_layer_ids=[1], vocab=2048, seq_len=256, docs=2, markov_rank=32, block_size=8,
                 max_anchors=16, markov_kind="vanilla"),
}
COLUMNS = """config hidden layers vocab seq_len block_size anchors markov_rank markov_kind threads steps_per_side
ours_ms theirs_ms ratio ratio_rounds ours_min_ms theirs_min_ms ours_forward_ms ours_backward_ms ours_optimizer_ms theirs_forward_ms
theirs_backward_ms theirs_optimizer_ms ours_peak_rss_mib theirs_peak_rss_mib ours_params theirs_params huge_pages
reference""".split()
# fmt: on


# ---------------------------------------------------------------------------------------------- reference venv
def ensure_reference_venv(venv: Path, install: bool = True, log=print) -> tuple[Path | None, str]:
    """The reference venv's python if ``speculators`` imports there (creating the venv if allowed), and a status."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import speculators.models.dspark, speculators.train.cli"]

    def works() -> bool:
        return python.exists() and subprocess.run(probe, capture_output=True, cwd=tempfile.gettempdir()).returncode == 0

    if works():
        return python, f"found in {venv}"
    if not install:
        return None, f"not available ({venv} has no working speculators; installation disabled)"
    log(f"creating the reference venv {venv} (pip install speculators; a few minutes) ...")
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints-cpu.txt"), "speculators"],
        [str(python), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio"],
    ]
    for command in steps:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"installation failed: `{' '.join(command)}`: {error}"
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            return None, f"installation failed: `{' '.join(command)}` exited {done.returncode}: {tail}"
    if works():
        return python, f"installed into {venv}"
    return None, f"installation finished but `import speculators` fails in {venv}"


# ---------------------------------------------------------------------------------------------- shared inputs
def make_target(cfg: dict, directory: Path) -> None:
    """A random-weight Qwen3 causal LM shaped by ``cfg`` (both drafters take their frozen embedding/LM head)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["hidden"],
        intermediate_size=cfg["intermediate"],
        num_hidden_layers=cfg["target_layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"],
        max_position_embeddings=max(4096, cfg["seq_len"]),
        tie_word_embeddings=True,
        rope_theta=10_000.0,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory)


def make_inputs(cfg: dict, path: Path) -> None:
    """One packed row of ``docs`` equal documents; the first quarter of each is prompt (loss mask 0)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    S, docs, H = cfg["seq_len"], cfg["docs"], cfg["hidden"]
    length = S // docs
    document_ids = (torch.arange(S) // length).clamp(max=docs - 1)
    position_ids = torch.arange(S) - document_ids * length
    loss_mask = (position_ids >= length // 4).long()
    tensors = {
        "input_ids": torch.randint(0, cfg["vocab"] - 1, (1, S), generator=g),
        "loss_mask": loss_mask[None],
        "document_ids": document_ids[None],
        "position_ids": position_ids[None],
        "context_features": torch.randn(1, S, len(cfg["target_layer_ids"]) * H, generator=g),
        "final_hidden": torch.randn(1, S, H, generator=g),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


# ---------------------------------------------------------------------------------------------- our worker
def ours_worker(config_path: str) -> None:
    """Our side of the protocol described in ``_speculators_driver.py``."""
    cfg = json.loads(Path(config_path).read_text())
    import torch

    from dspark_lightning.huge_pages import huge_pages_on

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    from safetensors.torch import load_file

    from dspark_lightning.lightning.config import LossArgs, TargetArgs
    from dspark_lightning.lightning.module import DSparkModule
    from dspark_lightning.metrics import AcceptanceMetrics
    from dspark_lightning.models import DrafterConfig, MarkovHeadConfig, TargetFeatures

    rank = cfg["markov_rank"]
    head = MarkovHeadConfig(rank=rank) if cfg["markov_kind"] == "vanilla" else MarkovHeadConfig("gated", rank)
    drafter = DrafterConfig(
        target_layer_ids=cfg["target_layer_ids"],
        block_size=cfg["block_size"],
        num_layers=cfg["num_layers"],
        max_anchors=cfg["max_anchors"],
        sample_from_anchor=True,
        mask_token_id=cfg["mask_token_id"],
        markov_head=head,
        confidence_head=True,
        confidence_with_markov=True,
    )
    loss = LossArgs(weights=cfg["loss"], gamma=cfg["gamma"])
    module = DSparkModule(TargetArgs(cfg["target_dir"], dtype="float32"), drafter, loss)
    inputs = load_file(cfg["inputs"])
    batch = dict(inputs)  # precomputed target features ride with the batch (the offline-cache path), as theirs do
    if not hasattr(module, "target_features"):  # a module without that path: serve them from the target instead
        features = TargetFeatures(inputs["context_features"], inputs["final_hidden"])
        module.target.features = lambda input_ids, position_ids: features
    params = [p for p in module.drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    module.train()
    generator = torch.Generator().manual_seed(cfg["seed"])

    bf16 = cfg.get("precision") == "bf16"

    def step() -> dict:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # what Lightning's bf16-mixed wraps
            out = module.shared_step(batch, generator)
        total = out.loss
        with torch.no_grad():  # what training_step logs
            stats = AcceptanceMetrics(module.metric_block_size)
            stats.update(out.alpha, out.greedy_match, out.valid)
            stats.compute()
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(module.drafter.parameters(), 1.0)
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "loss": float(total.detach()),
                "logits_dtype": str(out.drafter_output.logits.dtype).removeprefix("torch.")}  # fmt: skip

    for _ in range(cfg["warmup"]):
        step()
    say = lambda payload: print("@@ " + json.dumps(payload), flush=True)  # noqa: E731
    say(
        {
            "ready": True,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "trainable_params": sum(p.numel() for p in params),
            "huge_pages": huge_pages_on(),  # what this worker's allocator was asked for, read back
        }
    )
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        steps = [step() for _ in range(int(command[1]))]
        with open("/proc/self/status") as handle:
            hwm = next(int(x.split()[1]) / 1024 for x in handle if x.startswith("VmHWM:"))
        say({"steps": steps, "peak_rss_mib": hwm})


# ---------------------------------------------------------------------------------------------- orchestration
class Worker:
    """A warm worker process speaking the ``@@ json`` line protocol."""

    def __init__(
        self, name: str, command: list[str], threads: int, log_path: Path, cwd: Path, env: dict | None = None
    ) -> None:
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} | (env or {})
        env.setdefault("PYTHONPATH", str(ROOT))
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=cwd
        )
        self.ready: dict | None = None

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        self.proc.wait()
        self.log.flush()
        tail = " | ".join(self.log_path.read_text().strip().splitlines()[-4:])
        raise RuntimeError(f"{self.name} worker exited with {self.proc.returncode}: {tail}")

    def ask(self, command: str) -> dict:
        """Send one command line and read its ``@@`` answer."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def run(self, steps: int) -> dict:
        return self.ask(f"run {steps}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _step_ms(step: dict) -> float:
    return (step["forward"] + step["backward"] + step["optimizer"]) * 1e3


def bench_config(
    name: str,
    cfg: dict,
    workdir: Path,
    reference_python: Path | None,
    rounds: int,
    steps: int,
    warmup: int,
    threads: int,
    log=print,
    precision: str = "fp32",
    huge_pages: str = "both",
) -> tuple[dict, str]:
    """Alternated timing of one config; returns the result row and the reference's status for it."""
    workdir.mkdir(parents=True, exist_ok=True)
    make_target(cfg, workdir / "target")
    make_inputs(cfg, workdir / "inputs.safetensors")
    # fmt: off
    run_cfg = {**cfg, "target_dir": str(workdir / "target"), "inputs": str(workdir / "inputs.safetensors"),
               "mask_token_id": cfg["vocab"] - 1, "vocab_size": cfg["vocab"], "loss": LOSS, "gamma": 4.0, "lr": 6e-4,
               "seed": 0, "warmup": warmup, "threads": threads, "reference_attention": "sdpa",
               "precision": precision}
    # fmt: on
    (workdir / "config.json").write_text(json.dumps(run_cfg))
    ours = [sys.executable, "-m", "benchmarks.training.step_vs_speculators", "--worker", str(workdir / "config.json")]
    thp = {
        side: {"THP_MEM_ALLOC_ENABLE": "1" if side in HUGE_PAGES[huge_pages] else "0"} for side in ("ours", "theirs")
    }
    workers = {"ours": Worker("ours", ours, threads, workdir / "ours.log", ROOT, thp["ours"])}
    status = "not run"
    if reference_python is not None:
        command = [str(reference_python), str(DRIVER), str(workdir / "config.json")]
        workers["theirs"] = Worker("theirs", command, threads, workdir / "theirs.log", workdir, thp["theirs"])
    times: dict[str, list[dict]] = {side: [] for side in workers}
    rss: dict[str, float] = {}
    round_ratios: list[float] = []  # ours / theirs of each round's medians
    try:
        for side, worker in list(workers.items()):
            try:
                worker.ready = worker.read()
            except RuntimeError as error:
                if side == "ours":
                    raise
                status = f"reference failed to start: {error}"
                worker.close()
                del workers[side], times[side]
        if "theirs" in workers:
            status = f"speculators {workers['theirs'].ready['version']}, attention sdpa, eager losses"
        for r in range(rounds):
            order = list(workers) if r % 2 == 0 else list(workers)[::-1]
            for side in order:
                try:
                    answer = workers[side].run(steps)
                except RuntimeError as error:
                    if side == "ours":
                        raise
                    status = f"reference failed during timing: {error}"
                    workers[side].close()
                    del workers[side]
                    times.pop(side)
                    continue
                times[side] += answer["steps"]
                rss[side] = answer["peak_rss_mib"]
            medians = {k: statistics.median(map(_step_ms, t[-steps:])) for k, t in times.items()}
            if len(medians) == 2:
                round_ratios.append(medians["ours"] / medians["theirs"])
            per_side = "  ".join(f"{k} {v:.0f} ms" for k, v in medians.items())
            log(f"  {name} round {r + 1}/{rounds}: {per_side}")
    finally:
        params = {side: w.ready["trainable_params"] for side, w in workers.items() if w.ready}
        ours_huge_pages = workers["ours"].ready and workers["ours"].ready["huge_pages"]
        for worker in workers.values():
            worker.close()
    dtypes = {s["logits_dtype"] for s in times["ours"]}
    if dtypes != {"bfloat16" if precision == "bf16" else "float32"}:  # the precision asked for is the one timed
        raise RuntimeError(f"{name}: --precision {precision} but our step's draft logits were {sorted(dtypes)}")
    # fmt: off
    row = {"config": name, "hidden": cfg["hidden"], "layers": cfg["num_layers"], "vocab": cfg["vocab"],
           "seq_len": cfg["seq_len"], "block_size": cfg["block_size"], "anchors": cfg["max_anchors"],
           "markov_rank": cfg["markov_rank"], "markov_kind": cfg["markov_kind"], "threads": threads,
           "steps_per_side": len(times["ours"])}
    # fmt: on
    for side in ("ours", "theirs"):
        samples = times.get(side, [])
        total = [_step_ms(s) for s in samples]
        row[f"{side}_ms"] = statistics.median(total) if total else ""
        row[f"{side}_min_ms"] = min(total) if total else ""
        for phase in ("forward", "backward", "optimizer"):
            row[f"{side}_{phase}_ms"] = statistics.median(s[phase] * 1e3 for s in samples) if samples else ""
        row[f"{side}_peak_rss_mib"] = rss.get(side, "")
        row[f"{side}_params"] = params.get(side, "")
    row["ratio"] = row["ours_ms"] / row["theirs_ms"] if row["theirs_ms"] != "" else ""
    row["ratio_rounds"] = statistics.median(round_ratios) if round_ratios and row["theirs_ms"] != "" else ""
    # ours as read back in the worker (off where the kernel's THP is "never"); theirs as set in its environment
    state = lambda on: "on" if on else "off"  # noqa: E731
    row["huge_pages"] = f"ours {state(ours_huge_pages)}, theirs {state('theirs' in HUGE_PAGES[huge_pages])}"
    row["reference"] = status
    return {c: row[c] for c in COLUMNS}, status


# ---------------------------------------------------------------------------------------------- results
def _fmt(value, spec: str = ".1f") -> str:
    return "—" if value == "" else format(value, spec)


def write_results(rows: list[dict], machine: dict, out_dir: Path, stem: str, notes: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
    lines = [
        "# Training step: ours vs speculators DSpark (CPU)",
        "",
        "Forward + backward + optimizer step of one packed row, both sides with the same config and inputs (see "
        "`benchmarks/training/step_vs_speculators.py` for the method). Times are medians over all timed steps of each side after "
        "warm-up, the sides alternating in batches; ratio = ours / theirs of those medians (< 1: ours is faster); ratio "
        "(rounds) = the median over rounds of the same ratio within each round (both sides measured back to back, "
        "so less exposed to load that changes between rounds). Generated by "
        "`python -m benchmarks.training.step_vs_speculators`.",
        "",
        f"Machine: {machine['cpu']} (flags: {machine.get('flags', 'not recorded')}), {machine['cores']} cores visible, torch {machine['torch']}, "
        f"{rows[0]['threads'] if rows else '?'} torch thread per side; load average {machine['load_average']} at start, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at end (a shared machine: other jobs ran meanwhile).",
        "",
        "| config | H | layers | V = Vd | S | B | A | rank | head | ours ms | theirs ms | ratio | ratio (rounds) "
        "| ours min | theirs min | steps/side |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['hidden']} | {r['layers']} | {r['vocab']} | {r['seq_len']} | {r['block_size']} "
            f"| {r['anchors']} | {r['markov_rank']} | {r['markov_kind']} | {_fmt(r['ours_ms'])} | "
            f"{_fmt(r['theirs_ms'])} | {_fmt(r['ratio'], '.2f')}{'×' if r['ratio'] != '' else ''} | "
            f"{_fmt(r['ratio_rounds'], '.2f')}{'×' if r['ratio_rounds'] != '' else ''} | "
            f"{_fmt(r['ours_min_ms'])} | {_fmt(r['theirs_min_ms'])} | {r['steps_per_side']} |"
        )
    lines += [
        "",
        "Where the time goes (median ms per phase; forward includes the loss and the metrics, backward includes the "
        "grad-norm clip), peak resident memory of each worker process (model, optimizer state, inputs and the step's "
        "peak) and trainable parameters (equal counts = the same model):",
        "",
        "| config | ours fwd | ours bwd | ours opt | theirs fwd | theirs bwd | theirs opt | ours RSS MiB | "
        "theirs RSS MiB | ours params | theirs params |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {_fmt(r['ours_forward_ms'])} | {_fmt(r['ours_backward_ms'])} | "
            f"{_fmt(r['ours_optimizer_ms'])} | {_fmt(r['theirs_forward_ms'])} | {_fmt(r['theirs_backward_ms'])} | "
            f"{_fmt(r['theirs_optimizer_ms'])} | {_fmt(r['ours_peak_rss_mib'], '.0f')} | "
            f"{_fmt(r['theirs_peak_rss_mib'], '.0f')} | {r['ours_params']} | {r['theirs_params']} |"
        )
    lines += ["", *notes, ""]
    (out_dir / f"{stem}.md").write_text("\n".join(lines))


def run(
    quick: bool = False,
    out_dir: Path = RESULTS,
    reference_venv: Path | None = DEFAULT_VENV,
    install: bool = True,
    threads: int = 1,
    rounds: int | None = None,
    steps: int | None = None,
    log=print,
    precision: str = "fp32",
    suffix: str = "",
    huge_pages: str = "both",
) -> list[dict]:
    """Run the benchmark and write its results; ``reference_venv=None`` measures our side only."""
    if huge_pages not in HUGE_PAGES:
        raise ValueError(f"huge_pages must be one of {', '.join(HUGE_PAGES)}; got {huge_pages!r}")
    from dspark_lightning.machine import machine_description

    machine = machine_description()
    start = time.perf_counter()
    configs = QUICK_CONFIG if quick else CONFIGS
    rounds = rounds or (2 if quick else 5)
    steps = steps or (1 if quick else 2)
    if reference_venv is None:
        python, venv_status = None, "disabled (--no-reference)"
    else:
        python, venv_status = ensure_reference_venv(Path(reference_venv), install, log)
    log(f"reference: {venv_status}")
    rows, statuses = [], []
    with tempfile.TemporaryDirectory(prefix="bench_train_step_") as tmp:
        for name, cfg in configs.items():
            row, status = bench_config(
                name,
                cfg,
                Path(tmp) / name,
                python,
                rounds,
                steps,
                1 if quick else 2,
                threads,
                log,
                precision,
                huge_pages,
            )
            rows.append(row)
            statuses.append(f"{name}: {status}")
            log(
                f"{name}: ours {_fmt(row['ours_ms'])} ms, theirs {_fmt(row['theirs_ms'])} ms, "
                f"ratio {_fmt(row['ratio'], '.2f')}"
            )
    notes = [
        f"Reference environment: {venv_status}. Per config: " + "; ".join(statuses) + ".",
        "Same for both sides: one packed row, "
        + (
            "bf16 autocast around the forward (what `bf16-mixed` runs; fp32 weights and optimizer)"
            if precision == "bf16"
            else "fp32, no autocast"
        )
        + " and no `torch.compile`, AdamW (lr 6e-4, betas 0.9/0.95), "
        'grad-norm clip 1.0, loss `{"ce": 0.1, "tv": 0.9}` (theirs: eager losses) with exp(-k/4) slot weights, '
        "confidence head on [h ; W1[prev]] with BCE to the detached acceptance, `sample_from_anchor=True`, "
        "4 packed documents, target features precomputed, sdpa attention, heads 8 (4 KV, head_dim 32), "
        "intermediate 768 (`tiny`: heads 4/2, head_dim 16, intermediate 128).",
        f"Huge pages (`--huge-pages {huge_pages}`): "
        + "; ".join(f"{row['config']}: {row['huge_pages']}" for row in rows)
        + " (PyTorch's 2 MB pages for CPU tensors of 2 MB or more, THP_MEM_ALLOC_ENABLE=1, which `dspark-lightning` "
        "turns on by default; speculators leaves it off).",
        f"Total benchmark time {time.perf_counter() - start:.0f} s.",
    ]
    stem = "_".join(["train_step", *(["bf16"] if precision == "bf16" else []), *([suffix] if suffix else [])])
    stem += "" if huge_pages == "both" else f"_thp_{huge_pages}"
    stem += "_quick" if quick else ""
    write_results(rows, machine, out_dir, stem, notes)
    log(f"wrote {out_dir}/{stem}.{{csv,md}}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, 2 rounds of 1 step (smoke run)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the CSV/markdown go")
    parser.add_argument("--reference-venv", type=Path, default=DEFAULT_VENV, help="throw-away venv for speculators")
    parser.add_argument("--no-reference", action="store_true", help="measure our side only")
    parser.add_argument("--no-install", action="store_true", help="do not create the reference venv when absent")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per side (default 1)")
    parser.add_argument("--rounds", type=int, default=None, help="alternation rounds (default 5; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per side per round (default 2)")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: both sides' forward under bf16 autocast (bf16-mixed); files train_step_bf16*",
    )
    parser.add_argument(
        "--huge-pages",
        choices=list(HUGE_PAGES),
        default="both",
        help="which side gets PyTorch's huge-page allocation (both: one allocator setting for both, the default; "
        "ours: each side's own default; files *_thp_ours / *_thp_none)",
    )
    parser.add_argument("--suffix", default="", help="appended to the result files' stem (e.g. amx: the machine kind)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        ours_worker(args.worker)
        return
    run(
        args.quick,
        args.out_dir,
        None if args.no_reference else args.reference_venv,
        not args.no_install,
        args.threads,
        args.rounds,
        args.steps,
        precision=args.precision,
        suffix=args.suffix,
        huge_pages=args.huge_pages,
    )


if __name__ == "__main__":
    main()
