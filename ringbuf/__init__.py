"""A generic shared-memory ring of fixed-layout float64 records.

One writer, any number of readers, in any processes that know the ring's name.
Nothing here knows what the records mean.
"""

from ringbuf.ring import ReadResult, Ring, Rows
from ringbuf.segment import NAME_PREFIX

__all__ = ["NAME_PREFIX", "ReadResult", "Ring", "Rows"]
