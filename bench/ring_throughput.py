"""Ring throughput against the plain numpy copies it is built from.

    python bench/ring_throughput.py [--fields 20] [--records 200000]

Writes: ``Ring.write`` (seqlock, checksum, head) vs assigning the same row into
a plain in-process array. Reads: one ``Ring.read`` batch (two sequence reads,
copy, checksum verify) vs fancy-indexing the same rows out of a plain array.
The ratios are the price of never accepting a torn record.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ringbuf import Ring


def best_of(repeats: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fields", type=int, default=20)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, f = args.records, args.fields
    rows = np.random.default_rng(0).random((n, f))
    row_list = list(rows)
    plain = np.zeros((n, f + 3))
    ring = Ring.create([f"f{i}" for i in range(f)], n)
    try:

        def plain_write() -> None:
            for i, row in enumerate(row_list):
                plain[i, 3:] = row

        def ring_write() -> None:
            for row in row_list:
                ring.write(row)

        index = np.arange(n)
        plain_w = best_of(args.repeats, plain_write)
        ring_w = best_of(args.repeats, ring_write)
        plain_r = best_of(args.repeats, lambda: plain[index % n])
        cursor = ring.head - n
        ring_r = best_of(args.repeats, lambda: ring.read(cursor))
        assert len(ring.read(cursor)) == n
    finally:
        ring.close()
        ring.unlink()

    print(f"{n} records of {f} float64 fields, best of {args.repeats}")
    print("| operation | plain numpy rows/s | ring rows/s | ring / plain time |")
    print("|---|---:|---:|---:|")
    print(f"| write one row | {n / plain_w:,.0f} | {n / ring_w:,.0f} | {ring_w / plain_w:.1f}x |")
    print(f"| batch read | {n / plain_r:,.0f} | {n / ring_r:,.0f} | {ring_r / plain_r:.1f}x |")


if __name__ == "__main__":
    main()
