"""One side of ``bench.py``: a warm process that runs ``DSparkModule`` training steps from a feature cache.

Runs as a script (``python experiments/training_step_speedup/_worker.py CONFIG.json``) so that ``dspark_lightning`` is
imported from the first ``PYTHONPATH`` entry: this tree, or an exported older revision for the "before" side. It uses
only what every compared revision has: ``DSparkModule`` and its config groups, ``CachedFeatureDataset``,
``lightning.step.compound_loss`` / ``confidence_loss`` and the drafter's submodules.

A step is what ``DSparkModule.training_step`` plus Lightning's optimisation do: ``shared_step`` (target features
and, with a format 2 cache, the teacher statistics from the batch; drafter forward; compound loss and confidence
BCE), the ``AcceptanceMetrics`` update it logs, ``zero_grad``, ``backward``, grad-norm clip 1.0, ``optimizer.step``.
Step i reads cached row i mod (rows) with anchors from one generator seeded once, so every side trains on the same
rows and anchors from the same initial weights (``torch.manual_seed`` before the module is built).

Protocol (driven by ``bench.py``; only ``@@`` lines on stdout are protocol, logs go to stderr):
``@@ {"ready": ...}`` after the warm-up steps, then one answer per stdin line: ``run N`` (N timed steps),
``profile`` (one step under the profiler, split into parts), ``memory`` (one step's peak of live tensor bytes),
``quit``.
"""

from __future__ import annotations

import json
import sys
import time

PARTS = ("teacher", "projection", "attention", "mlp", "draft_head", "markov", "confidence", "loss", "optimizer")


def _say(payload: dict) -> None:
    print("@@ " + json.dumps(payload), flush=True)


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) / 1024 for line in handle if line.startswith("VmHWM:"))


class Side:
    def __init__(self, cfg: dict) -> None:
        import torch

        torch.set_num_threads(cfg["threads"])
        import dspark_lightning
        from dspark_lightning.data.cache import CachedFeatureDataset
        from dspark_lightning.lightning.config import LossArgs, TargetArgs
        from dspark_lightning.lightning.module import DSparkModule
        from dspark_lightning.models import DrafterConfig, MarkovHeadConfig

        torch.manual_seed(cfg["seed"])
        drafter = DrafterConfig(**{**cfg["drafter"], "markov_head": MarkovHeadConfig(**cfg["markov_head"])})
        loss = LossArgs(weights=cfg["loss"], gamma=4.0)
        self.module = DSparkModule(TargetArgs(cfg["target"], features="cache"), drafter, loss).train()
        dataset = CachedFeatureDataset(cfg["cache"], batch_size=cfg["batch_size"])
        self.batches = [dataset.read(samples) for samples in dataset.batches()]
        self.params = [p for p in self.module.drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, **cfg["optimizer"])
        self.seed = cfg["seed"]
        self.generator = torch.Generator().manual_seed(self.seed)
        self.count = 0
        self.package = dspark_lightning.__file__
        self.stat_fields = sorted(set(self.batches[0]) - {"input_ids", "loss_mask", "document_ids", "position_ids"})

    def step(self, scope=None) -> dict:
        import torch

        from dspark_lightning.metrics import AcceptanceMetrics

        scope = scope or (lambda name: _NullScope())
        batch = self.batches[self.count % len(self.batches)]
        self.count += 1
        t0 = time.perf_counter()
        out = self.module.shared_step(batch, self.generator)
        with torch.no_grad():
            stats = AcceptanceMetrics(self.module.metric_block_size)
            stats.update(out.alpha, out.greedy_match, out.valid)
            stats.compute()
        t1 = time.perf_counter()
        with scope("optimizer"):
            self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        with scope("optimizer"):
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        t2 = time.perf_counter()
        with scope("optimizer"):
            self.optimizer.step()
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "loss": float(out.loss.detach())}

    def float64_loss(self) -> float:
        """The first step's loss evaluated in float64 by a copy of the module, through the full-vocabulary teacher
        (the statistics of a format 2 cache dropped): the exact value every side's first step approximates. Called
        by ``bench.py`` in its own process, before any step, so no worker's peak memory includes it."""
        import copy

        import torch

        module = copy.deepcopy(self.module).double()
        batch = {k: v.double() if v.is_floating_point() else v for k, v in self.batches[0].items()}
        batch = {k: v for k, v in batch.items() if k not in ("final_logsumexp", "final_argmax")}
        with torch.no_grad():
            return float(module.shared_step(batch, torch.Generator().manual_seed(self.seed)).loss)

    def profile(self) -> dict:
        """One step under the profiler with a record_function scope per part: forward = the scopes' time, backward
        = each autograd node's time charged to the part whose forward op created it (matched by sequence number)."""
        from torch.profiler import ProfilerActivity, profile, record_function

        import dspark_lightning.lightning.step as step_module

        drafter = self.module.drafter
        wrapped = [(drafter, "teacher"), (drafter.backbone, "fuse_context", "projection")]
        for layer in drafter.backbone.layers:
            wrapped += [(layer.self_attn, "forward", "attention"), (layer.mlp, "forward", "mlp")]
        wrapped += [(drafter, "output_logits", "draft_head"), (drafter, "confidence_logits", "confidence")]
        wrapped += [(step_module, "compound_loss", "loss"), (step_module, "confidence_loss", "confidence")]
        if drafter.markov_head is not None:  # W1 lookups: where the head's own scope, or the confidence's, holds them
            wrapped += [
                (drafter.markov_head, "block_bias", "markov"),
                (drafter.markov_head.markov_w1, "forward", "markov"),
            ]
        saved = []
        for entry in wrapped:
            obj, name, part = entry if len(entry) == 3 else (*entry, entry[1])
            saved.append((obj, name, obj.__dict__.get(name)))
            setattr(obj, name, _scoped(getattr(obj, name), part, record_function))
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                self.step(lambda name: record_function("part:" + name))
                total = (time.perf_counter() - start) * 1e3
        finally:
            for obj, name, original in saved:
                if original is None:
                    delattr(obj, name)
                else:
                    setattr(obj, name, original)
        return {"total_ms": total, "parts": _split(prof.events(), total)}

    def memory(self) -> dict:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import Action, MemoryProfile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
            self.step()
        current = peak = 0
        for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
            current += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
            peak = max(peak, current)
        return {"peak_tensor_mib": peak / 2**20, "peak_rss_mib": _peak_rss_mib()}


class _NullScope:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def _scoped(function, part: str, record_function):
    def call(*args, **kwargs):
        with record_function("part:" + part):
            return function(*args, **kwargs)

    return call


def _part(event) -> str | None:
    """The outermost part scope around a profiler event, or None."""
    found = None
    while event is not None:
        if event.name.startswith("part:"):
            found = event.name[5:]
        event = event.cpu_parent
    return found


def _split(events, total_ms: float) -> dict:
    """Forward / backward ms per part (``other`` = the rest of the step: anchors, masks, embeddings, gathers, metrics,
    autograd bookkeeping)."""
    forward = dict.fromkeys(PARTS, 0.0)
    backward = dict.fromkeys(PARTS, 0.0)
    created: dict[int, str] = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::"):
            part = _part(event)
            if part is not None:
                created.setdefault(event.sequence_nr, part)
    for event in events:
        if event.cpu_parent is not None:
            continue
        if event.name.startswith("part:"):
            forward[event.name[5:]] += event.cpu_time_total / 1e3
        elif event.name.startswith("autograd::engine::evaluate_function"):
            part = created.get(event.sequence_nr)
            if part is not None:
                backward[part] += event.cpu_time_total / 1e3
    parts = {name: {"forward_ms": forward[name], "backward_ms": backward[name]} for name in PARTS}
    rest = total_ms - sum(forward.values()) - sum(backward.values())
    parts["other"] = {"forward_ms": rest, "backward_ms": 0.0}
    return parts


def main() -> None:
    cfg = json.loads(open(sys.argv[1]).read())
    import torch

    side = Side(cfg)
    first = [side.step()["loss"] for _ in range(cfg["warmup"])]
    params = sum(p.numel() for p in side.params)
    _say({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads(), "package": side.package,
          "trainable_params": params, "first_losses": first, "batch_fields": side.stat_fields})  # fmt: skip
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        if command[0] == "run":
            _say({"steps": [side.step() for _ in range(int(command[1]))]})
        elif command[0] == "profile":
            _say(side.profile())
        elif command[0] == "memory":
            _say(side.memory())


if __name__ == "__main__":
    main()
