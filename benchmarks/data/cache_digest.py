"""What recording a cache shard's BLAKE2b digest costs next to writing the shard (``cache``'s ``save_file``).

    python -m benchmarks.data.cache_digest [--mib 256] [--repeats 5] [--quick] [--out-dir DIR]

Method: a shard of the cache's shape (bf16 features, int32 ids) of ``--mib`` MiB is written with safetensors'
``save_file`` to a temporary file and renamed (as ``cache`` does), then its size and digest are recorded with
``shard_record`` (the file read back in 8 MiB pieces, from the page cache as right after a write); both timed
alternately ``--repeats`` times, medians reported with their ratio. The digest check on a shard's first read costs
the same read. Writes ``cache_digest.json`` / ``.md`` (``_quick`` in quick mode), naming the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dspark_lightning.data.cache_integrity import shard_record
from dspark_lightning.machine import machine_description, machine_line

RESULTS = Path(__file__).resolve().parent / "results"


def run(mib: int, repeats: int, out_dir: Path, quick: bool = False, log=print) -> dict:
    from safetensors.torch import save_file

    hidden = 576  # SmolLM2-135M's hidden size; 4 feature rows (3 context layers + the final hidden state) per token
    tokens = max(1, (mib << 20) // (hidden * 4 * 2 + 13))
    tensors = {
        "context_features": torch.randn(tokens, 3 * hidden).to(torch.bfloat16),
        "final_hidden": torch.randn(tokens, hidden).to(torch.bfloat16),
        "input_ids": torch.randint(0, 49152, (tokens,), dtype=torch.int32),
    }
    write_s, digest_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "features-00000.safetensors")
        for _ in range(repeats):
            start = time.perf_counter()
            save_file(tensors, str(path.with_suffix(".partial")))
            os.replace(path.with_suffix(".partial"), path)
            write_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            record = shard_record(path)
            digest_s.append(time.perf_counter() - start)
    size = record["bytes"]
    result = dict(
        shard_bytes=size, repeats=repeats, write_seconds=write_s, digest_seconds=digest_s,
        write_median_s=statistics.median(write_s), digest_median_s=statistics.median(digest_s),
        digest_over_write=statistics.median(digest_s) / statistics.median(write_s),
        digest_mib_per_s=size / 2**20 / statistics.median(digest_s), machine=machine_description(),
    )  # fmt: skip
    stem = "cache_digest_quick" if quick else "cache_digest"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / f"{stem}.md").write_text(
        f"{machine_line(result['machine'])}\n\n"
        "| shard | write (save_file + rename), median | BLAKE2b digest, median | digest / write | digest rate |\n"
        "|---:|---:|---:|---:|---:|\n"
        f"| {size / 2**20:.0f} MiB | {result['write_median_s'] * 1e3:.0f} ms | {result['digest_median_s'] * 1e3:.0f} ms "
        f"| {result['digest_over_write']:.2f} | {result['digest_mib_per_s']:.0f} MiB/s |\n"
    )
    log((out_dir / f"{stem}.md").read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--quick", action="store_true", help="a 4 MiB shard, twice (checks it runs; times mean nothing)"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    mib, repeats = (4, 2) if args.quick else (args.mib, args.repeats)
    run(mib, repeats, args.out_dir, quick=args.quick)


if __name__ == "__main__":
    main()
