# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The per-record loop of the join (`WindowedJoin.process_many`, with the expiry it runs:
`_expire` and `WindowIndex.pop_due`), compiled.

It works on the operator's own Python structures (the index's dict, deque, heap and set,
the state, `_changes`, the counters), so it and the pure-Python loop it mirrors
(`WindowedJoin._process_many_python`, the reference) can take turns on one operator.
What makes it cheaper is typed code, not compilation: keys built in one allocation
(big-endian fields written in C), partners found by a binary search with memcmp that
never builds its bound keys, no `Match.__new__` or `Overlay` method frames per record.
And less garbage-collector work: the index lists, due entries and matches it makes hold
only bytes, ints and None, so they cannot be part of a reference cycle and are untracked
at birth (CPython untracks such plain tuples itself, at their first collection); a full
collection then walks fewer objects, and comes less often (about a third of the gain in
benchmarks/bench_operator.py at Python's default GC thresholds, less at a worker's).

An event it cannot take the fast way (a value that is not exactly bytes, a timestamp
far outside any real epoch in ms, ...) goes to the Python loop, alone: one event's
`process_many` is the same as its share of a batch (everything carried over lives on
the operator), so the outcome, errors included, is the reference's.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError
from cpython.list cimport PyList_Append, PyList_Insert
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport Py_LT, PyObject, PyObject_RichCompareBool
from cpython.set cimport PySet_Add, PySet_Contains, PySet_Discard
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint64_t
from libc.stdio cimport snprintf
from libc.string cimport memcpy

from heapq import heappop, heappush

from tables.operators import keys
from tables.operators.kv import Overlay

cdef extern from *:
    """
    #include <string.h>
    #include "_bigendian.h"  /* fj_be64, fj_read_be64, fj_be32, fj_read_be32, FJ_SIGN */

    /* Byte order of a and b, as bytes' < does it. */
    static inline int fj_cmp(const char *a, Py_ssize_t al, const char *b, Py_ssize_t bl) {
        int c = memcmp(a, b, (size_t)(al < bl ? al : bl));
        if (c) return c < 0 ? -1 : 1;
        return al < bl ? -1 : (al > bl);
    }

    /* Order of bytes k against pre + t8 (8 bytes), without building the latter. */
    static inline int fj_cmp_bound(PyObject *k, const char *pre, Py_ssize_t pl, const char *t8) {
        const char *s = PyBytes_AS_STRING(k);
        Py_ssize_t n = PyBytes_GET_SIZE(k);
        int c = memcmp(s, pre, (size_t)(n < pl ? n : pl));
        if (c) return c < 0 ? -1 : 1;
        if (n < pl) return -1;
        return fj_cmp(s + pl, n - pl, t8, 8);
    }

    static int fj_not_bytes(PyObject *k) {
        PyErr_Format(PyExc_TypeError, "join index holds a %.100s, not bytes", Py_TYPE(k)->tp_name);
        return -1;
    }

    /* bisect_left(held, pre + be64(t)): the first key not before that bound. */
    static Py_ssize_t fj_lower_bound_time(PyObject *held, const char *pre, Py_ssize_t pl, uint64_t t) {
        char t8[8];
        Py_ssize_t lo = 0, hi = PyList_GET_SIZE(held);
        fj_be64(t8, t);
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            PyObject *k = PyList_GET_ITEM(held, mid);
            if (!PyBytes_Check(k)) return fj_not_bytes(k);
            if (fj_cmp_bound(k, pre, pl, t8) < 0) lo = mid + 1; else hi = mid;
        }
        return lo;
    }

    /* bisect_left (right = 0) or bisect_right (right = 1) of bytes key in a list of bytes. */
    static Py_ssize_t fj_bisect(PyObject *held, PyObject *key, int right) {
        const char *ks = PyBytes_AS_STRING(key);
        Py_ssize_t kn = PyBytes_GET_SIZE(key), lo = 0, hi = PyList_GET_SIZE(held);
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            PyObject *k = PyList_GET_ITEM(held, mid);
            if (!PyBytes_Check(k)) return fj_not_bytes(k);
            int c = fj_cmp(PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), ks, kn);
            if (right ? c <= 0 : c < 0) lo = mid + 1; else hi = mid;
        }
        return lo;
    }

    /* a > b for two bytes (a TypeError if b is not bytes). */
    static int fj_greater(PyObject *a, PyObject *b) {
        if (!PyBytes_Check(b)) return fj_not_bytes(b);
        return fj_cmp(PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a),
                      PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)) > 0;
    }

    /* tuple.__new__(type, (a, b, c, d)) for a tuple subclass (Match), without the call. */
    static PyObject *fj_new4(PyObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d) {
        PyTypeObject *t = (PyTypeObject *)type;
        PyObject *m = t->tp_alloc(t, 4);
        if (m == NULL) return NULL;
        PyObject_GC_UnTrack(m);  /* bytes, None and an int: no cycle through it */
        Py_INCREF(a); PyTuple_SET_ITEM(m, 0, a);
        Py_INCREF(b); PyTuple_SET_ITEM(m, 1, b);
        Py_INCREF(c); PyTuple_SET_ITEM(m, 2, c);
        Py_INCREF(d); PyTuple_SET_ITEM(m, 3, d);
        return m;
    }
    """
    uint64_t FJ_SIGN
    void fj_be64(char *p, uint64_t v) noexcept
    uint64_t fj_read_be64(const char *p) noexcept
    void fj_be32(char *p, unsigned int v) noexcept
    unsigned int fj_read_be32(const char *p) noexcept
    Py_ssize_t fj_lower_bound_time(object held, const char *pre, Py_ssize_t pl, uint64_t t) except -1
    Py_ssize_t fj_bisect(object held, object key, int right) except -1
    int fj_greater(object a, object b) except -1
    object fj_new4(object type, object a, object b, object c, object d)
    void PyObject_GC_UnTrack(void *op)

# Window bounds and timestamps beyond this (2**61 ms: 73 million years) go the Python way:
# below it no sum the loop makes overflows 64 bits, nor any time packed leaves the key range.
cdef int64_t LIMIT = 1LL << 61
cdef bytes UNMATCHED_FLAG = b"\x00"
cdef bytes MATCHED_FLAG = b"\x01"
cdef object _unpack_len = keys.LEN.unpack_from
cdef object _unpack_time = keys.TIME.unpack_from

# Set by bind() (tables/operators/windowed.py; importing it here would be circular).
cdef object _Match = None
cdef object _unmatched = None


def bind(match: type, unmatched: object) -> object:
    """Hand over the operator module's `Match` and `_unmatched`; returns `process_many`."""
    global _Match, _unmatched
    _Match, _unmatched = match, unmatched
    return process_many


cdef inline int64_t _sat(object due_time) except? -1:
    """A due time as int64, saturated: those of stored records may pass 2**63 - 1, and
    compared with times below LIMIT a saturated one orders as the true one."""
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(due_time, &overflow)
    if overflow > 0:
        return INT64_MAX
    if overflow < 0:
        return INT64_MIN
    return v


cdef inline bytes _prefix(char side, const char *key, Py_ssize_t kl):
    """`r` side len(key) key (tables/operators/keys.py) in one allocation."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 6 + kl)
    cdef char *p = PyBytes_AS_STRING(out)
    p[0] = c'r'
    p[1] = side
    fj_be32(p + 2, <unsigned int>kl)
    memcpy(p + 6, key, kl)
    return out


cdef inline bytes _record_key(bytes prefix, int64_t ts, bytes record_id):
    cdef Py_ssize_t pl = PyBytes_GET_SIZE(prefix), il = PyBytes_GET_SIZE(record_id)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, pl + 8 + il)
    cdef char *p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(prefix), pl)
    fj_be64(p + pl, (<uint64_t>ts) ^ FJ_SIGN)  # ts + 2**63, as keys.TIME packs it
    memcpy(p + pl + 8, PyBytes_AS_STRING(record_id), il)
    return out


cdef inline bytes _concat(bytes a, bytes b):
    cdef Py_ssize_t al = PyBytes_GET_SIZE(a), bl = PyBytes_GET_SIZE(b)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, al + bl)
    cdef char *p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(a), al)
    memcpy(p + al, PyBytes_AS_STRING(b), bl)
    return out


cdef inline bytes _flagged(char flag, const char *value, Py_ssize_t vl):
    """flag byte + value: a stored record."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 1 + vl)
    cdef char *p = PyBytes_AS_STRING(out)
    p[0] = flag
    memcpy(p + 1, value, vl)
    return out


cdef inline bint _plain(object unscanned):
    """Overlay's `unscanned` as it is made (bytes, or a tuple of them): else its methods."""
    if type(unscanned) is bytes:
        return True
    if type(unscanned) is not tuple:
        return False
    for u in unscanned:
        if type(u) is not bytes:
            return False
    return True


cdef inline bint _fast_put(object unscanned, bytes record_prefix):
    """Whether Overlay.put takes every key under `record_prefix` without its scan index
    (`key.startswith(unscanned)`): then the loop writes its pending dict directly."""
    for u in (unscanned if type(unscanned) is tuple else (unscanned,)):
        if record_prefix.startswith(u):
            return True
    return False


cdef class _Batch:
    """One `process_many` call: the operator's structures, read once, and the loop."""

    cdef object join, state, due, due_append, due_popleft, base_get, get, put
    cdef dict by_prefix, changes, pending
    cdef list late_due, results
    cdef set ids
    cdef bint overlay, has_now, track_left, track_right, fast_left, fast_right
    cdef int64_t now, retention, before, after, close_left, close_right

    cdef bint setup(self, object join) except -1:
        """False if the window or the stream time is out of the fast path's range."""
        cdef object index = join.index
        cdef object window = join.window
        cdef object closes = join._closes
        bounds = (index.retention, window.before, window.after, closes["left"], closes["right"])
        for bound in bounds:
            if type(bound) is not int or not 0 <= bound <= LIMIT:
                return False
        self.retention, self.before, self.after, self.close_left, self.close_right = bounds
        now = join.stream_time
        self.has_now = now is not None
        if self.has_now:
            if type(now) is not int or not -LIMIT <= now <= LIMIT:
                return False
            self.now = now
        self.join = join
        self.by_prefix = index.by_prefix
        self.due = index.due
        self.due_append = self.due.append
        self.due_popleft = self.due.popleft
        self.late_due = index.late_due
        self.ids = index.ids
        self.changes = join._changes
        tracked = join._tracked
        self.track_left = "left" in tracked
        self.track_right = "right" in tracked
        self.results = []
        state = self.state = join.state
        # Overlay's get/put/expire inlined on its pending dict; any other KV by its methods.
        self.overlay = type(state) is Overlay and _plain(state._unscanned)
        if self.overlay:
            self.pending = state.pending
            self.base_get = state.base.get
            self.fast_left = _fast_put(state._unscanned, b"rL")
            self.fast_right = _fast_put(state._unscanned, b"rR")
        else:
            self.get, self.put = state.get, state.put  # read when the Python loop reads them
        return True

    cdef object read(self, object key):
        cdef PyObject *value
        if self.overlay:
            value = PyDict_GetItemWithError(self.pending, key)
            if value != NULL:
                return <object>value
            return self.base_get(key)
        return self.get(key)

    cdef int write(self, object key, object value, bint fast) except -1:
        if self.overlay:
            # Overlay.put: a key already pending, or one it keeps out of its scan index, is
            # only a dict write; any other goes through put (the sorted pending keys).
            if fast or key in self.pending:
                self.pending[key] = value
            else:
                self.state.put(key, value)
        else:
            self.put(key, value)
        return 0

    cdef bint reload_now(self) except -1:
        """After an event the Python loop took: its stream time, if still in range."""
        now = self.join.stream_time
        self.has_now = now is not None
        if self.has_now:
            if type(now) is not int or not -LIMIT <= now <= LIMIT:
                return False
            self.now = now
        return True

    cdef bint holds(self, bytes prefix, bytes own) except -1:
        """WindowIndex.holds."""
        cdef PyObject *found = PyDict_GetItemWithError(self.by_prefix, prefix)
        if found == NULL:
            return False
        cdef list held = <object>found
        cdef Py_ssize_t at = fj_bisect(held, own, 0)
        return at < len(held) and held[at] == own

    cdef int event(self, object side, object key, object ts, object record_id, object value) except -1:
        """One event of the loop: 1 if done, 0 (nothing touched) if it is the Python loop's."""
        if (
            type(key) is not bytes
            or type(record_id) is not bytes
            or type(value) is not bytes
            or type(ts) is not int
            or type(side) is not str
        ):
            return 0
        cdef bint left
        if side == "left":
            left = True
        elif side == "right":
            left = False
        else:
            return 0
        cdef int overflow = 0
        cdef int64_t t = PyLong_AsLongLongAndOverflow(ts, &overflow)
        if overflow or t < -LIMIT or t > LIMIT:
            return 0
        cdef Py_ssize_t kl = PyBytes_GET_SIZE(key)
        if kl > 0xFFFFFFFF:
            return 0
        cdef const char *kp = PyBytes_AS_STRING(key)

        cdef bytes prefix = _prefix(c'L' if left else c'R', kp, kl)
        cdef bytes own = _record_key(prefix, t, record_id)
        # Duplicates first: a record read again after a takeover is one, not a late record.
        cdef bytes id_key = None
        cdef bint duplicate
        if self.ids is not None:
            id_key = _concat(prefix, record_id)
            duplicate = PySet_Contains(self.ids, id_key)
        else:
            duplicate = self.holds(prefix, own)
        if duplicate:
            self.join._count("duplicates")
            return 1
        if self.has_now and t + (self.close_left if left else self.close_right) < self.now:
            self.join._count("late")
            return 1
        due = self.due
        if not self.has_now or t > self.now:
            self.join.stream_time = ts  # written to the state once per batch (take_changes)
            self.has_now, self.now = True, t
            if (len(due) and _sat(due[0][0]) < t) or (self.late_due and _sat(self.late_due[0][0]) < t):
                self.expire()

        # Partners: the other side's records of this join key within the window.
        cdef bytes other = _prefix(c'R' if left else c'L', kp, kl)
        cdef int64_t lo, hi
        if left:
            lo, hi = t - self.before, t + self.after
        else:
            lo, hi = t - self.after, t + self.before
        cdef Py_ssize_t ol = 6 + kl, first = 0, end = 0, i, n = 0
        cdef list held = None
        cdef PyObject *found = PyDict_GetItemWithError(self.by_prefix, other)
        if found != NULL:
            held = <object>found
            if held:
                first = fj_lower_bound_time(held, PyBytes_AS_STRING(other), ol, (<uint64_t>lo) ^ FJ_SIGN)
                end = fj_lower_bound_time(held, PyBytes_AS_STRING(other), ol, (<uint64_t>(hi + 1)) ^ FJ_SIGN)
        cdef bint matched = end > first
        cdef bint tracked, unmatched
        cdef int64_t partner_ts
        if matched:
            tracked = self.track_right if left else self.track_left
            for i in range(first, end):
                partner_key = held[i]
                partner = self.read(partner_key)
                if partner is None:  # the index and the state disagree: a bug, not bad input
                    raise RuntimeError(f"join state lost record {partner_key!r} its index holds")
                if PyBytes_GET_SIZE(partner_key) < ol + 8:
                    _unpack_time(partner_key, ol)  # raises as the Python loop does
                partner_ts = <int64_t>(fj_read_be64(PyBytes_AS_STRING(partner_key) + ol) ^ FJ_SIGN)
                later = ts if t > partner_ts else PyLong_FromLongLong(partner_ts)
                if type(partner) is bytes:
                    n = PyBytes_GET_SIZE(partner)
                    rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(partner) + 1, n - 1) if n else b""
                    unmatched = tracked and n and PyBytes_AS_STRING(partner)[0] == 0
                else:
                    rest = partner[1:]
                    unmatched = tracked and partner[:1] == UNMATCHED_FLAG
                if left:
                    PyList_Append(self.results, fj_new4(_Match, key, value, rest, later))
                else:
                    PyList_Append(self.results, fj_new4(_Match, key, rest, value, later))
                if unmatched:
                    if type(partner) is bytes:
                        flipped = _flagged(1, PyBytes_AS_STRING(partner) + 1, n - 1)
                    else:
                        flipped = MATCHED_FLAG + rest
                    self.changes[partner_key] = flipped
                    self.write(partner_key, flipped, self.fast_right if left else self.fast_left)

        # The record itself.
        stored = _flagged(1 if matched else 0, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
        self.changes[own] = stored
        self.write(own, stored, self.fast_left if left else self.fast_right)
        # ... and in the index (WindowIndex.add), after the expiry above, which may drop a key's list.
        found = PyDict_GetItemWithError(self.by_prefix, prefix)
        cdef list mine
        if found == NULL:
            mine = [own]
            PyObject_GC_UnTrack(<void *>mine)  # holds record keys only (module docstring)
            self.by_prefix[prefix] = mine
        else:
            mine = <object>found
            n = len(mine)
            if n == 0:
                raise IndexError("list index out of range")
            if fj_greater(own, mine[n - 1]):
                PyList_Append(mine, own)
            else:
                PyList_Insert(mine, fj_bisect(mine, own, 1), own)  # insort
        cdef int64_t due_at = t + self.retention
        entry = (PyLong_FromLongLong(due_at), own)
        PyObject_GC_UnTrack(<void *>entry)  # an int and bytes
        if not len(due):
            self.due_append(entry)
        else:
            last = due[len(due) - 1]
            last_at = _sat(last[0])
            if due_at > last_at or (due_at == last_at and own > last[1]):  # entry > due[-1]
                self.due_append(entry)
            else:
                heappush(self.late_due, entry)
        if id_key is not None:
            PySet_Add(self.ids, id_key)
        return 1

    cdef int expire(self) except -1:
        """WindowedJoin._expire(emit=True) with WindowIndex.pop_due(stream time) inlined."""
        cdef int64_t now = self.now
        cdef list out = []
        due, late = self.due, self.late_due
        if late:  # WindowIndex._pop_merged
            while True:
                if (
                    len(due)
                    and _sat(due[0][0]) < now
                    and (not late or PyObject_RichCompareBool(due[0], late[0], Py_LT))
                ):
                    out.append(self.due_popleft()[1])
                elif late and _sat(late[0][0]) < now:
                    out.append(heappop(late)[1])
                else:
                    break
        elif len(due) and _sat(due[0][0]) < now:  # the rule (records in event-time order)
            out.append(self.due_popleft()[1])
            while len(due) and _sat(due[0][0]) < now:
                out.append(self.due_popleft()[1])
        else:
            return 0
        cdef dict by_prefix = self.by_prefix
        cdef bytes record_key, prefix
        cdef list held
        cdef Py_ssize_t n, end
        cdef const char *p
        for record_key in out:
            n = PyBytes_GET_SIZE(record_key)
            if n < 6:
                _unpack_len(record_key, 2)  # raises as pop_due does
            p = PyBytes_AS_STRING(record_key)
            end = 6 + <Py_ssize_t>fj_read_be32(p + 2)
            prefix = PyBytes_FromStringAndSize(p, end if end < n else n)
            held = by_prefix[prefix]
            if not held:
                raise IndexError("list index out of range")  # held[0], as pop_due reads it
            if held[0] != record_key:  # the oldest of its key, as a rule: due in time order
                held.remove(record_key)
            elif len(held) == 1:
                del by_prefix[prefix]
                continue
            else:
                del held[0]
            if not held:
                del by_prefix[prefix]
        if self.ids is not None:
            for record_key in out:
                n = PyBytes_GET_SIZE(record_key)
                p = PyBytes_AS_STRING(record_key)
                end = 6 + <Py_ssize_t>fj_read_be32(p + 2)
                # record_key[:end] + record_key[end + 8:]
                PySet_Discard(
                    self.ids,
                    PyBytes_FromStringAndSize(p, end if end < n else n)
                    + PyBytes_FromStringAndSize(p + end + 8, n - end - 8 if end + 8 < n else 0),
                )
        cdef bint side_tracked
        if self.track_left or self.track_right:
            for record_key in out:
                side_byte = PyBytes_AS_STRING(record_key)[1]
                if side_byte == c'L':
                    side_tracked = self.track_left
                elif side_byte == c'R':
                    side_tracked = self.track_right
                else:
                    raise KeyError(<unsigned char>side_byte)  # keys.BYTE_SIDE[record_key[1]]
                if side_tracked:
                    value = self.read(record_key)
                    if value is not None and value[:1] == UNMATCHED_FLAG:
                        self.results.append(self.unmatched(record_key, value))
        if self.overlay:
            pending = self.pending
            for record_key in out:
                pending[record_key] = None  # Overlay.expire
        else:
            expire = self.state.expire
            for record_key in out:
                expire(record_key)
        return 0

    cdef object unmatched(self, bytes record_key, object value):
        """operator._unmatched: a record emitted with no partner."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(record_key)
        cdef const char *p = PyBytes_AS_STRING(record_key)
        cdef Py_ssize_t end = 6 + <Py_ssize_t>fj_read_be32(p + 2)
        if type(value) is not bytes or n < end + 8:
            return _unmatched(record_key, value)
        key = PyBytes_FromStringAndSize(p + 6, end - 6)
        ts = PyLong_FromLongLong(<int64_t>(fj_read_be64(p + end) ^ FJ_SIGN))
        rest = value[1:]
        if p[1] == c'L':
            return fj_new4(_Match, key, rest, None, ts)
        return fj_new4(_Match, key, None, rest, ts)


def process_many(join: object, events: object) -> list:
    """WindowedJoin.process_many of `join` (exactly a WindowedJoin), compiled."""
    if _Match is None:
        raise RuntimeError("tables.operators._fastjoin.bind() was not called (tables.operators.windowed does it)")
    cdef _Batch batch = _Batch.__new__(_Batch)
    if not batch.setup(join):
        return join._process_many_python(events)
    results = batch.results
    it = iter(events)
    for side, key, ts, record_id, value in it:
        if not batch.event(side, key, ts, record_id, value):
            results += join._process_many_python(((side, key, ts, record_id, value),))
            if not batch.reload_now():  # a stream time out of range: the rest the Python way
                results += join._process_many_python(it)
                break
    return results


# -- the audit records (a join's `audit` option) -----------------------------------------

cdef extern from *:
    """
    static const char FJ_HEX[] = "0123456789abcdef";
    """
    const char *FJ_HEX

cdef bytes _NULL_PART = b"\xff\xff\xff\xff"


cdef Py_ssize_t _part_size(object value):
    """The bytes a key or value takes in the fingerprint's input, or -1: not exactly bytes,
    or too long for its 4-byte length (the reference decides it)."""
    if value is None:
        return 4
    if type(value) is not bytes or PyBytes_GET_SIZE(value) > 0xFFFFFFFF:
        return -1
    return 4 + PyBytes_GET_SIZE(value)


cdef char *_put_part(char *p, object value):
    cdef Py_ssize_t n
    if value is None:
        memcpy(p, PyBytes_AS_STRING(_NULL_PART), 4)
        return p + 4
    n = PyBytes_GET_SIZE(value)
    fj_be32(p, <unsigned int>n)
    memcpy(p + 4, PyBytes_AS_STRING(value), n)
    return p + 4 + n


cdef object _audit_one(object partition, object match, bytes writer_json, object blake2b):
    """`audit_value` of one result (tables/runtime/output.py, the reference), or None where
    the reference must decide (a field of another type or out of range)."""
    cdef object key = match[0], left = match[1], right = match[2], ts = match[3]
    cdef int overflow = 0
    cdef long long ts_n, partition_n
    if type(key) is not bytes or type(ts) is not int or type(partition) is not int:
        return None
    ts_n = PyLong_AsLongLongAndOverflow(ts, &overflow)
    if overflow:
        return None
    partition_n = PyLong_AsLongLongAndOverflow(partition, &overflow)
    if overflow:
        return None
    cdef Py_ssize_t nk = _part_size(key), nl = _part_size(left), nr = _part_size(right)
    if nk < 0 or nl < 0 or nr < 0:
        return None
    # The fingerprint's input (`fingerprint`, tables/operators/base.py): each part length-prefixed.
    cdef bytes data = PyBytes_FromStringAndSize(NULL, nk + nl + nr + 8)
    cdef char *p = PyBytes_AS_STRING(data)
    p = _put_part(p, key)
    p = _put_part(p, left)
    p = _put_part(p, right)
    fj_be64(p, <uint64_t>ts_n)
    cdef bytes digest = blake2b(data, digest_size=16).digest()
    # orjson's JSON of {"partition", "ts", "fingerprint" (hex), "writer"}, in that order.
    cdef char head[96]
    cdef int head_n = snprintf(head, sizeof(head), b'{"partition":%lld,"ts":%lld,"fingerprint":"',
                               partition_n, ts_n)
    cdef Py_ssize_t wn = PyBytes_GET_SIZE(writer_json)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, head_n + 32 + 11 + wn + 1)
    cdef char *o = PyBytes_AS_STRING(out)
    memcpy(o, head, head_n)
    o += head_n
    cdef const unsigned char *d = <const unsigned char *>PyBytes_AS_STRING(digest)
    cdef int i
    for i in range(16):
        o[2 * i] = FJ_HEX[d[i] >> 4]
        o[2 * i + 1] = FJ_HEX[d[i] & 15]
    o += 32
    memcpy(o, b'","writer":', 11)
    o += 11
    memcpy(o, PyBytes_AS_STRING(writer_json), wn)
    o[wn] = c'}'
    return out


def audit_many(feed, dict audited, str writer, object reference, object dumps, object blake2b):
    """`Collector.audit` compiled: for each (partition, Match) of `feed`, its audit record
    (key, value, no headers) appended to `audited[partition]`, the value as `reference`
    (`audit_value`) makes it, which makes those this does not cover. `dumps`: orjson.dumps,
    for the writer's JSON (once); `blake2b`: hashlib's."""
    cdef bytes writer_json = dumps(writer)
    cdef object value
    cdef list records
    for partition, match in feed:
        # The partition's list first, as the reference's setdefault(...).append(...) makes it.
        records = audited.get(partition)
        if records is None:
            records = audited[partition] = []
        value = _audit_one(partition, match, writer_json, blake2b)
        if value is None:
            value = reference(partition, match, writer)
        records.append((match[0], value, ()))
