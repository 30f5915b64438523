"""Two gloo processes run one DSparkModule training step under torch FSDP on CPU (used by tests/integration/lightning/test_scale.py).

Mirrors Lightning's FSDPStrategy, which refuses CPU: ``configure_model`` inside ``enable_wrap`` (each target decoder
layer and draft layer becomes a unit), the module wrapped as the root unit, the step run inside the root's forward.
Writes, per rank, the number of FSDP units, the sharded and unsharded losses and which parameters got gradients.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]


def run(rank: int, world_size: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import enable_wrap

    from dspark_lightning.data.datamodule import ShareGPTDataModule
    from dspark_lightning.lightning.config import TargetArgs
    from dspark_lightning.lightning.module import DSparkModule
    from dspark_lightning.models import DrafterConfig

    torch.manual_seed(0)
    target = str(ROOT / "assets/demo-target")
    module = DSparkModule(TargetArgs(target), DrafterConfig(mask_token_id=1, max_anchors=8))
    data = ShareGPTDataModule(
        tokenizer=target, train_files=str(ROOT / "assets/data/regenerated/train-00000.jsonl"), seq_len=128,
        batch_size=2, shuffle_buffer=0,
    )  # fmt: skip
    batch = next(iter(data.train_dataloader(rank=0, world_size=1)))
    unsharded = module.shared_step(batch, torch.Generator().manual_seed(1)).loss.item()
    before = {n: p.detach().clone() for n, p in module.target.named_parameters()}
    with enable_wrap(wrapper_cls=FSDP, use_orig_params=True, device_id=torch.device("cpu")):
        module.configure_model()
    module.forward = lambda b, g: module.shared_step(b, g).loss  # Lightning runs the step inside the root forward
    model = FSDP(module, use_orig_params=True, device_id=torch.device("cpu"))
    loss = model(batch, torch.Generator().manual_seed(1))
    loss.backward()
    parameters = dict(model.module.named_parameters())
    drafter_grads = sum(p.grad is not None for n, p in parameters.items() if p.requires_grad)
    target_grads = sum(p.grad is not None for n, p in parameters.items() if n.startswith("target."))
    with FSDP.summon_full_params(model):
        unchanged = all(torch.equal(p, before[n]) for n, p in model.module.target.named_parameters() if n in before)
    queue.put(
        {
            "rank": rank,
            "fsdp_units": sum(isinstance(m, FSDP) for m in model.modules()),
            "loss": loss.item(),
            "unsharded_loss": unsharded,
            "drafter_grads": drafter_grads,
            "target_grads": target_grads,
            "target_unchanged": unchanged,
        }
    )
    dist.destroy_process_group()


def main(output: str) -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = 29_500 + os.getpid() % 1000
    processes = [context.Process(target=run, args=(rank, 2, port, queue)) for rank in range(2)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=240) for _ in processes]
    for process in processes:
        process.join()
    if any(process.exitcode for process in processes):
        raise SystemExit("an FSDP worker failed")
    Path(output).write_text(json.dumps(sorted(results, key=lambda r: r["rank"])))


if __name__ == "__main__":
    main(sys.argv[1])
