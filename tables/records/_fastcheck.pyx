# cython: language_level=3, boundscheck=False, wraparound=False
"""The join's per-input-record check (`SideCodec.accept`, tables/records/codecs.py), compiled for
its common configuration, and the decode of a stored record (`RecordForm.stored`).

Covered: a key of raw bytes, str or int (`key_check`'s `raw_key`, `str_key`, `int_key`);
a value that is a plain `faust.Record` in JSON (`RecordForm._plain`: fields of JSON types,
checked by their annotations; up to 64 fields) or a JSON object without `validate`; the time
from an int field or the Kafka timestamp; the id from a str field or the offset;
`validate`; `max_value_bytes`. tables/records/codecs.py makes none for anything else.

Only the happy path is here. A record that leaves it before `validate` runs (no key or
value, too large, a key that is not plain digits or not UTF-8, malformed JSON, not an
object, a field missing, null or of another type, a timestamp that is not an int within
0..MAX_TS_MS or is past the wall clock plus `max_future` (`Horizon`), an id that is not a str, ...) is handed whole to the Python accept it was
made with (the reference), which decides it and whose answer is returned as it is. Every
test that can send a record there runs before `validate`, so `validate` runs once per
record either way; after it only its answer is left (a reason: `Rejected`; an
exception: raised, as the Python accept does).

The record is made as `_compile_build` makes it (`model.__new__(model)`, its `__dict__`
set to a new dict: "__evaluated_fields__" first, then the fields in declaration order
with their defaults for null or missing values).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_GetItem, PyDict_New, PyDict_SetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact, PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_XDECREF
from libc.stdint cimport int64_t, uint64_t
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    /* The JSON type of a value orjson decoded, as a bit (KIND_NAMES below). */
    static inline int fc_kind(PyObject *v) {
        PyTypeObject *t = Py_TYPE(v);
        if (t == &PyUnicode_Type) return 1;
        if (t == &PyLong_Type) return 2;
        if (t == &PyBool_Type) return 4;
        if (t == &PyFloat_Type) return 8;
        if (t == &PyList_Type) return 16;
        if (t == &PyDict_Type) return 32;
        return 64;
    }

    /* A call that leaves its error set instead of raising it (NULL: the record is handed over). */
    static inline PyObject *fc_call1(PyObject *f, PyObject *arg) {
        return PyObject_CallOneArg(f, arg);
    }

    /* The UTF-8 of a str (cached in the str object itself for ASCII), NULL with an error set. */
    static inline const char *fc_utf8(PyObject *s, Py_ssize_t *n) {
        return PyUnicode_AsUTF8AndSize(s, n);
    }

    /* bytes.decode() (UTF-8, strict), NULL with an error set. */
    static inline PyObject *fc_decode_utf8(const char *p, Py_ssize_t n) {
        return PyUnicode_DecodeUTF8(p, n, NULL);
    }

    /* object.__new__(type), as the builtin does it past its checks of the arguments. */
    static inline PyObject *fc_object_new(PyObject *type, PyObject *no_args) {
        return PyBaseObject_Type.tp_new((PyTypeObject *)type, no_args, NULL);
    }

    static inline void fc_be64(char *p, uint64_t v) {
        for (int i = 7; i >= 0; i--) { p[i] = (char)(v & 0xff); v >>= 8; }
    }
    """
    int fc_kind(PyObject *v) noexcept
    PyObject *fc_call1(PyObject *f, PyObject *arg) noexcept
    const char *fc_utf8(PyObject *s, Py_ssize_t *n) noexcept
    PyObject *fc_decode_utf8(const char *p, Py_ssize_t n) noexcept
    object fc_object_new(object type, object no_args)
    void fc_be64(char *p, uint64_t v) noexcept
    void PyErr_Clear() noexcept
    PyObject *Py_None

# The bits of a field's mask, in order (tables/records/codecs.py `_type_mask` makes the masks).
KIND_NAMES = ("str", "int", "bool", "float", "list", "dict", "other")

cdef enum:
    # The most fields of a model it takes (their values are kept on the C stack while checked).
    MAX_FIELDS = 64

MOST_FIELDS = MAX_FIELDS

cdef enum:  # key kinds (tables/records/codecs.py `_KEY_KINDS`)
    RAW_KEY = 0
    STR_KEY = 1
    INT_KEY = 2

cdef object _EVALUATED = "__evaluated_fields__"


cdef class _Model:
    """A plain RecordForm's model and fields: checked and made in one pass."""

    cdef object model, new
    cdef tuple names, defaults
    cdef Py_ssize_t count
    cdef bint object_new  # model.__new__ is object.__new__: call it without the builtin's frame
    cdef int *masks  # the KIND bits a non-null value may have
    cdef char *nonnull  # required and not nullable: null or missing is not well formed
    cdef char *has_default

    def __cinit__(self, model, names, masks, nonnull, defaults, no_default):
        self.model = model
        self.new = model.__new__
        # Safe only where object.__new__(model) is (no base of the model but object is in C).
        mro = model.__mro__
        self.object_new = self.new is object.__new__ and all(
            c.__flags__ & (1 << 9) for c in mro[: len(mro) - 1]  # Py_TPFLAGS_HEAPTYPE
        )
        self.names = tuple(names)
        self.defaults = tuple(defaults)
        self.count = len(self.names)
        if self.count > MAX_FIELDS:
            raise ValueError(f"more than {MAX_FIELDS} fields")
        if not (len(masks) == len(nonnull) == len(self.defaults) == self.count):
            raise ValueError("one mask, nonnull flag and default per field")
        for name in self.names:
            if type(name) is not str:
                raise TypeError(f"field name {name!r} is not a str")
        n = self.count if self.count else 1
        self.masks = <int *>malloc(n * sizeof(int))
        self.nonnull = <char *>malloc(n)
        self.has_default = <char *>malloc(n)
        if self.masks == NULL or self.nonnull == NULL or self.has_default == NULL:
            raise MemoryError()
        for i in range(self.count):
            self.masks[i] = masks[i]
            self.nonnull[i] = 1 if nonnull[i] else 0
            self.has_default[i] = 0 if self.defaults[i] is no_default else 1

    def __dealloc__(self):
        free(self.masks)
        free(self.nonnull)
        free(self.has_default)

    cdef bint collect(self, dict payload, PyObject **values) noexcept:
        """`_compile_check`'s tests: every field present or nullable, of its kinds. Leaves
        each field's value (borrowed from `payload`, NULL if missing) in `values`: each name
        is looked up once (the names are not the keys' objects: a lookup compares bytes)."""
        cdef PyObject *v
        for i in range(self.count):
            v = values[i] = PyDict_GetItem(payload, self.names[i])
            if v == NULL or v == Py_None:
                if self.nonnull[i]:
                    return False
            elif not (self.masks[i] & fc_kind(v)):
                return False
        return True

    cdef object build(self, PyObject **values):
        """The record from its fields' values, as `_compile_build`'s `make(payload)` makes it."""
        cdef PyObject *v
        cdef dict fields = PyDict_New()
        PyDict_SetItem(fields, _EVALUATED, set())
        for i in range(self.count):
            v = values[i]
            if v == NULL or v == Py_None:
                PyDict_SetItem(fields, self.names[i], self.defaults[i] if self.has_default[i] else None)
            else:
                PyDict_SetItem(fields, self.names[i], <object>v)
        record = fc_object_new(self.model, ()) if self.object_new else self.new(self.model)
        record.__dict__ = fields
        return record

    cdef object make(self, dict payload):
        """The record of a decoded JSON object (not checked)."""
        cdef PyObject *values[MAX_FIELDS]
        for i in range(self.count):
            values[i] = PyDict_GetItem(payload, self.names[i])
        return self.build(values)


cdef class _Accept:
    """One side's configuration, and its check of one record."""

    cdef object handoff, loads, validate, rejected, ts_field, id_field
    cdef _Model form  # None: a JSON object (a JsonForm of objects)
    cdef int key_kind
    cdef Py_ssize_t ts_index, id_index  # the time's and the id's field in `form`, or -1
    cdef bint builds, has_limit, has_future, has_record_limit
    cdef int64_t limit, max_ts, record_limit  # record_limit: key, id and value together (`unwritable`)
    # `Horizon` (tables/records/codecs.py): the latest time accepted as of the clock last read.
    cdef int64_t max_future, ceiling

    cdef object run(self, object key, object value, object offset, object message_ts):
        """(ts, record id, built value or None), or what `handoff` answers."""
        cdef object decoded_key = self.decode_key(key)
        if decoded_key is None or not PyBytes_CheckExact(value) or (
            self.has_limit and PyBytes_GET_SIZE(value) > self.limit
        ):
            return self.handoff(key, value, offset, message_ts)
        cdef PyObject *decoded = fc_call1(<PyObject *>self.loads, <PyObject *>value)
        if decoded == NULL:  # malformed JSON: the reference says why
            PyErr_Clear()
            return self.handoff(key, value, offset, message_ts)
        cdef object payload = <object>decoded
        Py_XDECREF(decoded)  # `payload` holds its own reference
        cdef bint is_dict = PyDict_CheckExact(payload)
        cdef PyObject *values[MAX_FIELDS]
        # Not an object: the reference decides (a JsonForm of objects or a Record rejects it).
        if not is_dict or (self.form is not None and not self.form.collect(<dict>payload, values)):
            return self.handoff(key, value, offset, message_ts)
        # The time and the id are tested before `validate`: a record that would take the
        # reference's slow steps after it goes there whole, so `validate` runs once.
        cdef PyObject *found
        cdef int overflow = 0
        cdef long long n
        cdef object ts
        if self.ts_field is not None:
            if not is_dict:
                return self.handoff(key, value, offset, message_ts)
            if self.ts_index >= 0:
                found = values[self.ts_index]
            else:
                found = PyDict_GetItem(<dict>payload, self.ts_field)
            if found == NULL or not PyLong_CheckExact(<object>found):  # bool too: the reference's
                return self.handoff(key, value, offset, message_ts)
            ts = <object>found
        elif PyLong_CheckExact(message_ts):
            ts = message_ts
        else:
            return self.handoff(key, value, offset, message_ts)
        n = PyLong_AsLongLongAndOverflow(ts, &overflow)
        if overflow or n < 0 or (n > self.ceiling and not self.within_horizon(n)):
            return self.handoff(key, value, offset, message_ts)
        cdef object record_id = self.record_id(payload, is_dict, offset, values)
        if record_id is None or (self.has_record_limit and (
            PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(record_id) + PyBytes_GET_SIZE(value) > self.record_limit
        )):
            return self.handoff(key, value, offset, message_ts)
        built = None
        if self.builds:
            built = self.form.build(values)
            if self.validate is not None:
                reason = self.validate(decoded_key, built)  # raises as the reference's does
                if reason:
                    return self.rejected(str(reason), "rejected")
        return (ts, record_id, built)

    cdef bint within_horizon(self, int64_t n) noexcept:
        """Whether `n` (above `ceiling`) is accepted by the clock read now: `Horizon.refused`'s
        test; a time it refuses goes to the reference, which says why."""
        if not self.has_future:
            return n <= self.max_ts
        cdef timespec now
        clock_gettime(CLOCK_REALTIME, &now)
        cdef int64_t now_ms = <int64_t>now.tv_sec * 1000 + now.tv_nsec // 1000000
        self.ceiling = min(self.max_ts, now_ms + self.max_future)
        return n <= self.ceiling

    cdef object decode_key(self, object key):
        """The key as the key check returns it, or None: not the simple case."""
        if not PyBytes_CheckExact(key):
            return None
        if self.key_kind == RAW_KEY:
            return key
        cdef const char *p = PyBytes_AS_STRING(key)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(key)
        if self.key_kind == STR_KEY:
            decoded = fc_decode_utf8(p, size)
            if decoded == NULL:
                PyErr_Clear()
                return None
            text = <object>decoded
            Py_XDECREF(decoded)
            return text
        # int(raw) for an optional '-' and 1 to 18 ASCII digits, no leading zero (as Faust
        # writes an int); bigger numbers, or a key the reference rejects (a leading zero, -0,
        # spaces, '+', '_', ...): the reference does those.
        cdef bint negative = size > 0 and p[0] == c'-'
        cdef Py_ssize_t i = 1 if negative else 0
        if size - i < 1 or size - i > 18 or (p[i] == c'0' and (negative or size - i > 1)):
            return None
        cdef int64_t v = 0
        while i < size:
            if p[i] < c'0' or p[i] > c'9':
                return None
            v = v * 10 + (p[i] - c'0')
            i += 1
        return PyLong_FromLongLong(-v if negative else v)

    cdef object record_id(self, object payload, bint is_dict, object offset, PyObject **values):
        """The id as the reference makes it, or None: not the simple case."""
        cdef char packed[8]
        cdef int overflow = 0
        cdef long long n
        cdef Py_ssize_t size
        cdef const char *text
        cdef PyObject *found
        if self.id_field is None:  # the offset, 8 bytes big-endian (struct ">Q")
            if not PyLong_CheckExact(offset):
                return None
            n = PyLong_AsLongLongAndOverflow(offset, &overflow)
            if overflow or n < 0:
                return None
            fc_be64(packed, <uint64_t>n)
            return PyBytes_FromStringAndSize(packed, 8)
        if not is_dict:
            return None
        if self.id_index >= 0:
            found = values[self.id_index]
        else:
            found = PyDict_GetItem(<dict>payload, self.id_field)
        if found == NULL:
            return None
        if PyLong_CheckExact(<object>found):  # an int id: its decimal digits, as str(id).encode()
            return str(<object>found).encode()
        if type(<object>found) is not str:
            return None
        text = fc_utf8(found, &size)
        if text == NULL:  # a lone surrogate: str.encode() raises, in the reference
            PyErr_Clear()
            return None
        return PyBytes_FromStringAndSize(text, size)


cdef class _Stored:
    cdef object handoff, loads
    cdef _Model form

    cdef object run(self, object raw):
        payload = self.loads(raw)
        if not PyDict_CheckExact(payload):
            return self.handoff(raw)  # it raises as it does
        return self.form.make(<dict>payload)


def model(model, names, masks, nonnull, defaults, no_default):
    """A plain model's fields for `accept` and `stored`: per field its name, the KIND bits
    its non-null values may have, whether null (or missing) is refused, and its default
    (`no_default` where it has none)."""
    return _Model(model, names, masks, nonnull, defaults, no_default)


def accept(handoff, loads, key_kind, _Model form, ts_field, id_field, validate, builds, limit, max_ts,
           rejected, max_future=None, max_record=None):
    """`SideCodec.accept` compiled for one covered configuration: `accept(key, value, offset,
    message_ts)` -> (ts, record id, built value or None), or what `handoff` (the Python
    accept) answers for the record. `form` None: a JSON object (JsonForm of objects, no validate);
    `ts_field` None: the Kafka timestamp; `id_field` None: the offset; `limit` None: none;
    `max_future` (ms) None: no bound ahead of the wall clock but `max_ts`; `max_record` (the
    key, id and value together, in bytes) None: none."""
    if key_kind not in (RAW_KEY, STR_KEY, INT_KEY):
        raise ValueError(f"unknown key kind {key_kind!r}")
    if ts_field is not None and type(ts_field) is not str:
        raise TypeError("ts_field: a str, or None for the Kafka timestamp")
    if id_field is not None and (type(id_field) is not str or not id_field):
        raise TypeError("id_field: a non-empty str, or None for the offset")
    if (validate is not None or builds) and (form is None or not builds):
        raise ValueError("validate needs a record, built (`builds`)")
    cdef _Accept check = _Accept.__new__(_Accept)
    check.handoff, check.loads, check.form, check.key_kind = handoff, loads, form, key_kind
    check.ts_field, check.id_field, check.validate, check.builds = ts_field, id_field, validate, builds
    check.rejected = rejected
    check.has_limit = limit is not None
    check.limit = min(limit, 2**63 - 1) if limit is not None else 0  # past int64: no limit a value reaches
    check.max_ts = max_ts
    check.has_record_limit = max_record is not None
    check.record_limit = min(max_record, 2**63 - 1) if max_record is not None else 0
    check.has_future = max_future is not None
    check.max_future = min(max_future, max_ts) if max_future is not None else 0
    check.ceiling = max_ts if max_future is None else -1  # read the clock at the first record
    names = form.names if form is not None else ()
    check.ts_index = names.index(ts_field) if ts_field in names else -1
    check.id_index = names.index(id_field) if id_field in names else -1

    # A function, not the object's __call__: its call is a vectorcall (no argument tuple).
    def accept(key, value, offset, message_ts):
        return check.run(key, value, offset, message_ts)

    accept._check = check  # for check_many, which runs it without the call
    return accept


def check_many(accept, side, topic, partition, records, list letters, dict built, dropped):
    """`check_records` (tables/records/sides.py, the reference) compiled: a partition's fetched
    records, in offset order, each through `accept` (a compiled accept is run in place; any
    other is called). Returns (offsets, stamps, events, nulls) of the accepted records as the
    reference does; rejected ones are appended to `letters`, values built on arrival put in
    `built` by the id of their bytes; `dropped` is codecs.DROPPED (a null value)."""
    cdef _Accept check = getattr(accept, "_check", None)
    cdef list offsets = []
    cdef list stamps = []
    cdef list events = []
    cdef Py_ssize_t nulls = 0
    cdef object key, value, offset, checked, ts
    for record in records:
        key = record.key
        value = record.value
        offset = record.offset
        if check is not None:
            checked = check.run(key, value, offset, record.timestamp)
        else:
            checked = accept(key, value, offset, record.timestamp)
        if type(checked) is tuple:
            ts = (<tuple>checked)[0]
            offsets.append(offset)
            stamps.append(ts)
            events.append((side, key, ts, (<tuple>checked)[1], value))
            if (<tuple>checked)[2] is not None:
                built[id(value)] = (value, (<tuple>checked)[2])
        elif checked is dropped:
            nulls += 1
        else:
            letters.append((topic, partition, offset, key, value, checked))
    return offsets, stamps, events, nulls


def stored(handoff, loads, _Model form not None):
    """`RecordForm.stored` of a plain model: `stored(raw)` decodes the bytes of a record
    checked when it arrived (with `loads`) and makes the record; anything but a JSON object
    goes to `handoff` (the Python one), which raises as it does."""
    cdef _Stored check = _Stored.__new__(_Stored)
    check.handoff, check.loads, check.form = handoff, loads, form

    def stored(raw):
        return check.run(raw)

    return stored
