# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The per-record loop of the join with its index in the state (`StoredIndexJoin.process_many`,
tables/operators/stored_window.py), compiled.

It mirrors `StoredIndexJoin.process` (the reference, which runs where this is not built) line
for line, on the operator's own attributes, so the two can take turns on one operator. What
makes it cheaper: keys built in one allocation (big-endian fields written in C), the key
filter's counters read and written in C, partners' times read from their keys in C, and the
batch overlay's `put` inlined (its pending dict written directly, its sorted index of pending
keys extended only for keys a scan may reach). The reads and scans of the state, expiry and
the read-ahead of the time index stay the operator's own methods.

An event it cannot take the fast way (a key, id or value that is not exactly bytes, a
timestamp far outside any real epoch in ms) goes to `process`, alone: one event's
`process_many` is the same as its share of a batch, so the outcome, errors included, is the
reference's.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject_Hash
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

from tables.operators import keys
from tables.operators.base import Match
from tables.operators.kv import Overlay

cdef extern from *:
    """
    #include "_bigendian.h"  /* fj_be64, fj_read_be64, fj_be32, FJ_SIGN: shared with _fastjoin */
    """
    void fj_be64(char *p, uint64_t v)
    uint64_t fj_read_be64(const char *p)
    void fj_be32(char *p, unsigned int v)
    uint64_t FJ_SIGN

# Timestamps and window bounds beyond this (2**61 ms) go the Python way: below it no sum the
# loop makes overflows 64 bits.
cdef int64_t LIMIT = 1LL << 61
cdef unsigned char SATURATED = 255
cdef bytes UNMATCHED_FLAG = b"\x00"
cdef bytes MATCHED_FLAG = b"\x01"
cdef bytes EXPIRY = keys.EXPIRY_INDEX
cdef bytes ID = keys.ID_INDEX


cdef inline bytes _prefix(char kind, char side, const char *key, Py_ssize_t kl):
    """kind side len(key) key: a record key's prefix (`r`) or an id key's (`i`)."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 6 + kl)
    cdef char *p = PyBytes_AS_STRING(out)
    p[0] = kind
    p[1] = side
    fj_be32(p + 2, <unsigned int>kl)
    memcpy(p + 6, key, kl)
    return out


cdef inline bytes _timed(bytes prefix, int64_t ts, bytes tail):
    """prefix, ts packed as keys.TIME packs it (ts + 2**63, big-endian), tail."""
    cdef Py_ssize_t pl = PyBytes_GET_SIZE(prefix), tl = PyBytes_GET_SIZE(tail)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, pl + 8 + tl)
    cdef char *p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(prefix), pl)
    fj_be64(p + pl, (<uint64_t>ts) ^ FJ_SIGN)
    memcpy(p + pl + 8, PyBytes_AS_STRING(tail), tl)
    return out


cdef inline bytes _concat(bytes a, bytes b):
    cdef Py_ssize_t al = PyBytes_GET_SIZE(a), bl = PyBytes_GET_SIZE(b)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, al + bl)
    cdef char *p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(a), al)
    memcpy(p + al, PyBytes_AS_STRING(b), bl)
    return out


cdef inline bint _in_range(object ts) except -1:
    return type(ts) is int and -LIMIT < ts < LIMIT


cdef class _Writer:
    """The state's `put`, with a batch overlay's inlined (Overlay.put: the key goes to the
    sorted index of pending keys unless it starts with one of `unscanned`, or is pending)."""

    cdef object state, put_method, overlay_keys_add
    cdef dict pending
    cdef tuple unscanned
    cdef bint inline

    def __init__(self, object state):
        self.state = state
        self.put_method = state.put
        self.inline = type(state) is Overlay and type(state.unscanned) is tuple
        if self.inline:
            self.pending = state.pending
            self.unscanned = state.unscanned
            self.overlay_keys_add = state._pending_keys.add

    cdef int put(self, bytes key, bytes value) except -1:
        if not self.inline:
            self.put_method(key, value)
            return 0
        if not key.startswith(self.unscanned) and key not in self.pending:
            self.overlay_keys_add(key)
            self.state._inserts += 1
        self.pending[key] = value
        return 0


def process_many(object join, object events):
    """`StoredIndexJoin.process_many`: the matches of each event in turn."""
    cdef list results = []
    cdef object state = join.state
    cdef _Writer writer = _Writer(state)
    cdef object get = state.get, scan = state.scan
    cdef object key_filter = join.filter
    cdef bytearray counts_array = key_filter.counts
    cdef unsigned char *counts = <unsigned char *>PyByteArray_AS_STRING(counts_array)
    cdef int64_t mask = key_filter.mask
    cdef bint ids = join.ids
    cdef object window = join.window
    cdef dict changes = join._changes
    cdef object tracked = join._tracked
    cdef bint left_tracked = "left" in tracked, right_tracked = "right" in tracked
    cdef object closes = join._closes
    cdef object process_one = join.process
    cdef int64_t before, after, close_left, close_right, retention
    if not (
        _in_range(window.before) and _in_range(window.after) and _in_range(window.grace)
        and _in_range(join._retention)
    ):
        for event in events:
            results += process_one(*event)
        return results
    before, after = window.before, window.after
    close_left, close_right = closes["left"], closes["right"]
    retention = join._retention

    cdef bint left, other_tracked
    cdef int64_t ts, lo, hi, partner_ts, later, expire_at, now = 0
    cdef Py_ssize_t slot, other_slot, at
    cdef bytes prefix, own, identity, other, stored, entry, partner_key, partner
    cdef char side_byte, other_byte
    cdef list found
    cdef object now_object
    for event in events:
        side_object, key, ts_object, record_id, value = event
        if not (
            type(key) is bytes and type(record_id) is bytes and type(value) is bytes
            and _in_range(ts_object) and (side_object == "left" or side_object == "right")
        ):
            results += process_one(side_object, key, ts_object, record_id, value)
            continue
        ts = ts_object
        left = side_object == "left"
        side_byte = c'L' if left else c'R'
        other_byte = c'R' if left else c'L'
        prefix = _prefix(c'r', side_byte, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        own = _timed(prefix, ts, record_id)
        if ids:
            identity = _concat(_prefix(c'i', side_byte, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)), record_id)
        else:
            identity = own
        slot = PyObject_Hash(prefix) & mask
        # Duplicates first: a record read again after a takeover is one, not a late record.
        if counts[slot] and get(identity) is not None:
            join._count("duplicates")
            continue
        now_object = join.stream_time
        if now_object is not None:
            now = now_object
            if ts + (close_left if left else close_right) < now:
                join._count("late")
                continue
        if now_object is None or ts > now:
            join.stream_time = ts_object  # written to the state once per batch (take_changes)
            if join._due < ts_object:
                results += join._expire(True)

        # Partners: the other side's records of this join key within the window.
        if left:
            lo, hi = ts - before, ts + after
        else:
            lo, hi = ts - after, ts + before
        other = _prefix(c'r', other_byte, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        other_slot = PyObject_Hash(other) & mask
        found = list(scan(_timed(other, lo, b""), _timed(other, hi + 1, b""))) if counts[other_slot] else []
        if found:
            at = PyBytes_GET_SIZE(other)
            other_tracked = right_tracked if left else left_tracked
            for partner_key, partner in found:
                partner_ts = <int64_t>(fj_read_be64(PyBytes_AS_STRING(partner_key) + at) ^ FJ_SIGN)
                later = ts if ts > partner_ts else partner_ts
                if left:
                    results.append(Match(key, value, partner[1:], later))
                else:
                    results.append(Match(key, partner[1:], value, later))
                if other_tracked and partner[:1] == UNMATCHED_FLAG:
                    # Only the flag changes: the partner's index entry stays as it is.
                    partner = _concat(MATCHED_FLAG, partner[1:])
                    changes[partner_key] = partner
                    writer.put(partner_key, partner)

        # The record itself, and its index entry.
        stored = _concat(MATCHED_FLAG if found else UNMATCHED_FLAG, value)
        changes[own] = stored
        writer.put(own, stored)
        if identity is not own:
            writer.put(identity, b"")
        expire_at = ts + retention
        entry = _timed(EXPIRY, expire_at, own)
        writer.put(entry, b"")
        join._live += 1
        if counts[slot] < SATURATED:  # KeyFilter.add, inlined
            counts[slot] += 1
        if expire_at <= join._ahead_until:
            join._add_ahead(entry)
        if expire_at < join._due:
            join._due = expire_at
    return results
