"""Time the checkpoint checksum (:func:`ggpo_lightning.records.integrity.file_sha256`) on a 1 GB file, one thread.

    python benchmarks/checksum_speed.py [--gb 1] [--repeats 3] [--dir DIR]

Writes a file of random bytes in DIR (default: the system temp folder; removed after), then hashes it
``--repeats`` times and prints each time and the median in MB/s. The file is in the page cache after it is
written, so this is the hash's own speed (what a save pays: it hashes the file it just wrote); a cold read
from a slow disk is bounded by the disk instead. hashlib runs on the calling thread only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from ggpo_lightning.records.integrity import file_sha256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    size = int(args.gb * 1e9)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "blob.bin"
        chunk = os.urandom(64 << 20)
        with open(path, "wb") as f:
            for start in range(0, size, len(chunk)):
                f.write(chunk[: min(len(chunk), size - start)])
        speeds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            file_sha256(path)
            seconds = time.perf_counter() - start
            speeds.append(size / 1e6 / seconds)
            print(f"{size / 1e9:.2f} GB hashed in {seconds:.2f} s: {speeds[-1]:.0f} MB/s", flush=True)
    print(f"median {statistics.median(speeds):.0f} MB/s (SHA-256, one thread, file in the page cache)")


if __name__ == "__main__":
    main()
