"""What a cache's ``index.json`` records of each shard (its byte size and BLAKE2b digest) and the checks against it.

``cache`` records both when it writes a shard; ``fit`` compares every shard's size when it opens a cache (a copy that
did not finish, a full disk), and a shard's digest when it first reads it, when the shard is small enough for that
to be cheap; ``cache --verify PATH`` checks every digest. Caches written before the record still load, with one line
saying they carry none (docs/guides/reliability.md)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from dspark_lightning.errors import UserError

DIGEST = "blake2b"
CHUNK_BYTES = 8 << 20  # read in 8 MiB pieces: a shard is never held in memory whole
# a shard up to this size is hashed when first read (about a second per GiB on one core); a larger one only by --verify
HASH_ON_READ_MAX_BYTES = 1 << 30
log = logging.getLogger(__name__)


class CacheDamagedError(UserError, ValueError):
    """A cache shard whose size or digest differs from what ``index.json`` recorded, or that is missing."""


def shard_record(path: str | os.PathLike) -> dict[str, object]:
    """``bytes`` and ``blake2b`` (hex) of a written shard, for its ``index.json`` entry."""
    digest = hashlib.blake2b()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, DIGEST: digest.hexdigest()}


def _advice(directory: Path) -> str:
    return (
        f"copy the shard again, or rerun the `dspark-lightning cache` command that wrote {directory} into a new "
        "--output"
    )


def check_sizes(directory: Path, shards: list[dict]) -> None:
    """Every shard exists with the byte size its entry records (entries without one are skipped: old caches)."""
    for shard in shards:
        path, recorded = directory / shard["file"], shard.get("bytes")
        if recorded is None:
            continue
        if not path.is_file():
            raise CacheDamagedError(f"{path}: the cache shard is missing; {_advice(directory)}")
        if (actual := path.stat().st_size) != recorded:
            cut = "cut short" if actual < recorded else "longer than written"
            raise CacheDamagedError(
                f"{path}: {actual} bytes, index.json records {recorded} ({cut}); {_advice(directory)}"
            )


def check_digest(path: str | os.PathLike, shard: dict) -> bool:
    """Compare a shard's digest with its entry; False when the entry records none (nothing to compare)."""
    recorded = shard.get(DIGEST)
    if recorded is None:
        return False
    actual = shard_record(path)[DIGEST]
    if actual != recorded:
        raise CacheDamagedError(
            f"{path}: its {DIGEST} digest differs from the one index.json records (the bytes changed after it was "
            f"written); {_advice(Path(path).parent)}"
        )
    return True


def verify_cache(directory: str | os.PathLike, shards: list[dict]) -> dict[str, list[str]]:
    """Every shard's size and digest: {"ok": [...], "damaged": ["file: why", ...], "unrecorded": [...]}."""
    directory = Path(directory)
    result: dict[str, list[str]] = {"ok": [], "damaged": [], "unrecorded": []}
    for shard in shards:
        try:
            check_sizes(directory, [shard])
            checked = check_digest(directory / shard["file"], shard)
        except CacheDamagedError as error:
            result["damaged"].append(str(error))
            continue
        result["ok" if checked else "unrecorded"].append(shard["file"])
    return result
