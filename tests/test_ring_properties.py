"""Property tests: ``Ring.read``'s cursor/lap arithmetic against a plain Python model."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringbuf import Ring

FIELDS = ("a", "b", "c")

# An operation is ("write", k) or ("read", reader_number).
writes = st.tuples(st.just("write"), st.integers(min_value=0, max_value=40))
reads = st.tuples(st.just("read"), st.sampled_from([0, 1]))
operations = st.lists(st.one_of(writes, reads), max_size=40)


def values_of(i: int) -> list[float]:
    return [float(i), -0.5 * i - 1.0, i * 7.0 + 0.25]


def timestamp_of(i: int) -> int:
    return 1_000 * i + 17


class ModelReader:
    def __init__(self) -> None:
        self.cursor = 0
        self.accepted = 0
        self.lost = 0


def check_read(ring: Ring, reader: ModelReader, written: int, capacity: int, as_rows: bool) -> None:
    """One read through ``read`` (arrays) or ``read_rows`` (Python values), against the model."""
    first = max(reader.cursor, written - capacity)
    expected = list(range(first, written))
    if as_rows:
        res = ring.read_rows(reader.cursor)
        indices, values, stamps = res.indices, [list(v) for v in res.values], res.timestamps_ns
    else:
        arrays = ring.read(reader.cursor)
        assert arrays.values.shape == (len(expected), len(FIELDS))
        indices, values, stamps = (
            arrays.indices.tolist(),
            arrays.values.tolist(),
            arrays.timestamps_ns.tolist(),
        )
        res = arrays  # type: ignore[assignment]

    assert indices == expected
    assert values == [values_of(i) for i in expected]
    assert stamps == [timestamp_of(i) for i in expected]
    assert res.lost == max(0, written - capacity - reader.cursor)
    assert res.cursor == written

    reader.cursor = res.cursor
    reader.accepted += len(indices)
    reader.lost += res.lost


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(min_value=1, max_value=16), ops=operations)
def test_reads_match_model(capacity, ops):
    ring = Ring.create(FIELDS, capacity)
    attached: list[Ring] = []
    try:
        # Two independent readers, each with its own attachment, as separate processes would have;
        # reader 0 reads arrays (read), reader 1 Python values (read_rows).
        for _ in range(2):
            attached.append(Ring.attach(ring.name))
        model = [ModelReader(), ModelReader()]
        written = 0
        for op, arg in ops:
            if op == "write":
                for _ in range(arg):
                    assert ring.write(values_of(written), timestamp_ns=timestamp_of(written)) == written
                    written += 1
                assert ring.head == written
            else:
                check_read(attached[arg], model[arg], written, capacity, as_rows=arg == 1)
        for number, (reader_ring, reader) in enumerate(zip(attached, model, strict=True)):
            check_read(reader_ring, reader, written, capacity, as_rows=number == 1)  # the final read
            assert reader.cursor == written == reader.accepted + reader.lost
    finally:
        ring.unlink()
        for r in attached:
            r.close()
        ring.close()


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=16),
    written=st.integers(min_value=0, max_value=100),
    data=st.data(),
)
def test_read_from_any_valid_cursor(capacity, written, data):
    """A read from any cursor in [0, head] accounts for exactly head - cursor records."""
    ring = Ring.create(FIELDS, capacity)
    try:
        for i in range(written):
            ring.write(values_of(i), timestamp_ns=timestamp_of(i))
        cursor = data.draw(st.integers(min_value=0, max_value=written), label="cursor")
        res = ring.read(cursor)
        first = max(cursor, written - capacity)
        np.testing.assert_array_equal(res.indices, np.arange(first, written))
        assert res.lost == first - cursor
        assert len(res) + res.lost == written - cursor
        assert res.cursor == written
    finally:
        ring.unlink()
        ring.close()
