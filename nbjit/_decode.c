/* nbjit._launch.decode_facts: the decoder of a cache entry's facts (nbjit/_facts.py's
 * `decode`) in C, for a warm start: the same objects from the same JSON data, made without
 * running Python code per record (on the H200 the Python decoder was ~170 us of a fresh
 * process's ~1.3 ms warm start, nearly all of it object making).
 *
 * decode_facts(data, classes, arch) -> the object `decode(data)` gives, where
 *   classes  dict {tag: (class, field names)}: the records facts hold
 *   arch     arch(text) -> the Arch a CubinInfo's `arch` field is decoded to
 * It takes exactly the shapes `_facts.encode` writes; anything else raises ValueError, and
 * the caller then runs the Python decoder (which decodes it or says what is wrong), so both
 * always agree. Limited API (abi3), Python >= 3.10. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

#define MAX_FIELDS 62
#define MAX_DEPTH 64 /* (encode writes about 10 levels: deeper data is left to the Python decoder) */

static PyObject *str_cubin_info = NULL; /* "CubinInfo": its arch field is an Arch */
static PyObject *str_arch = NULL;
static PyObject *object_new = NULL;     /* object.__new__ */

static PyObject *decode(PyObject *data, PyObject *classes, PyObject *arch, int depth);

static PyObject *unlike(void) {
    PyErr_SetString(PyExc_ValueError, "not the facts encode writes");
    return NULL;
}

/* str, int, bool, float or None: kept as they are (`type(x) in _PLAIN`) */
static int plain(PyObject *o) {
    return o == Py_None || PyUnicode_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o) ||
           PyFloat_CheckExact(o);
}

static PyObject *item(PyObject *o, PyObject *classes, PyObject *arch, int depth) {
    if (plain(o)) {
        Py_INCREF(o);
        return o;
    }
    return decode(o, classes, arch, depth);
}

/* ["", *items]: a tuple */
static PyObject *tuple_of(PyObject *data, Py_ssize_t n, PyObject *classes, PyObject *arch, int depth) {
    PyObject *out = PyTuple_New(n - 1), *x;
    Py_ssize_t i;
    if (out == NULL) return NULL;
    for (i = 1; i < n; i++) {
        x = item(PyList_GetItem(data, i), classes, arch, depth);
        if (x == NULL || PyTuple_SetItem(out, i - 1, x) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* ["2", *rows]: a tuple of tuples, each row a list of plain values */
static PyObject *pairs(PyObject *data, Py_ssize_t n) {
    PyObject *out = PyTuple_New(n - 1), *row, *t;
    Py_ssize_t i, j, m;
    if (out == NULL) return NULL;
    for (i = 1; i < n; i++) {
        row = PyList_GetItem(data, i);
        if (!PyList_CheckExact(row)) {
            Py_DECREF(out);
            return unlike();
        }
        m = PyList_Size(row);
        t = PyTuple_New(m);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (j = 0; j < m; j++) {
            PyObject *v = PyList_GetItem(row, j);
            Py_INCREF(v);
            PyTuple_SetItem(t, j, v);
        }
        PyTuple_SetItem(out, i - 1, t);
    }
    return out;
}

static PyObject *record_of(PyObject *data, Py_ssize_t n, PyObject *tag, PyObject *spec, PyObject *classes,
                           PyObject *arch, int depth);

/* [class name, bit mask of the fields that are records, *fields]: an instance made as
 * unpickling makes one (object.__new__, its fields set in its __dict__) */
static PyObject *record(PyObject *data, Py_ssize_t n, PyObject *tag, PyObject *classes, PyObject *arch,
                        int depth) {
    PyObject *spec = PyDict_GetItemWithError(classes, tag), *obj;
    if (spec == NULL) return PyErr_Occurred() ? NULL : unlike();
    if (!PyTuple_Check(spec) || PyTuple_Size(spec) != 2) return unlike();
    Py_INCREF(spec); /* (held while Python code runs: the arch callback) */
    obj = record_of(data, n, tag, spec, classes, arch, depth);
    Py_DECREF(spec);
    return obj;
}

static PyObject *record_of(PyObject *data, Py_ssize_t n, PyObject *tag, PyObject *spec, PyObject *classes,
                           PyObject *arch, int depth) {
    PyObject *cls, *names, *mask_obj, *obj, *dict;
    long long mask;
    Py_ssize_t count, i;
    int cubin;
    cls = PyTuple_GetItem(spec, 0);
    names = PyTuple_GetItem(spec, 1);
    if (!PyTuple_Check(names)) return unlike();
    count = PyTuple_Size(names);
    mask_obj = PyList_GetItem(data, 1);
    if (count > MAX_FIELDS || n != count + 2 || !PyLong_CheckExact(mask_obj)) return unlike();
    mask = PyLong_AsLongLong(mask_obj);
    if (mask == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return unlike();
    }
    if (mask < 0 || mask >= (1LL << count)) return unlike();
    cubin = PyUnicode_Compare(tag, str_cubin_info) == 0;
    obj = PyObject_CallFunctionObjArgs(object_new, cls, NULL);
    if (obj == NULL) return NULL;
    dict = PyObject_GenericGetDict(obj, NULL);
    if (dict == NULL) {
        Py_DECREF(obj);
        return NULL;
    }
    for (i = 0; i < count; i++) {
        PyObject *name = PyTuple_GetItem(names, i), *raw = PyList_GetItem(data, i + 2), *v;
        if (mask >> i & 1)
            v = decode(raw, classes, arch, depth);
        else {
            Py_INCREF(raw);
            v = raw;
        }
        if (v != NULL && cubin && PyUnicode_Check(name) && PyUnicode_Compare(name, str_arch) == 0) {
            PyObject *parsed = PyObject_CallFunctionObjArgs(arch, v, NULL); /* a CubinInfo's arch: an Arch */
            Py_DECREF(v);
            v = parsed;
        }
        if (v == NULL || PyDict_SetItem(dict, name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(dict);
            Py_DECREF(obj);
            return NULL;
        }
        Py_DECREF(v);
    }
    Py_DECREF(dict);
    return obj;
}

static PyObject *decode(PyObject *data, PyObject *classes, PyObject *arch, int depth) {
    PyObject *out = NULL;
    if (++depth > MAX_DEPTH) return unlike();
    if (Py_EnterRecursiveCall(" decoding facts")) return NULL;
    if (PyList_CheckExact(data)) {
        Py_ssize_t n = PyList_Size(data);
        PyObject *tag = n ? PyList_GetItem(data, 0) : NULL;
        if (tag == NULL || !PyUnicode_CheckExact(tag))
            out = unlike();
        else if (PyUnicode_GetLength(tag) == 0)
            out = tuple_of(data, n, classes, arch, depth);
        else if (PyUnicode_CompareWithASCIIString(tag, "2") == 0)
            out = pairs(data, n);
        else
            out = record(data, n, tag, classes, arch, depth);
    } else if (PyDict_CheckExact(data)) {
        PyObject *k, *v, *x;
        Py_ssize_t pos = 0;
        out = PyDict_New();
        while (out != NULL && PyDict_Next(data, &pos, &k, &v)) {
            x = item(v, classes, arch, depth);
            if (x == NULL || PyDict_SetItem(out, k, x) < 0) {
                Py_XDECREF(x);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(x);
        }
    } else if (plain(data)) {
        Py_INCREF(data);
        out = data;
    } else
        out = unlike();
    Py_LeaveRecursiveCall();
    return out;
}

PyObject *nbjit_decode_facts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_facts(data, classes, arch)");
        return NULL;
    }
    if (object_new == NULL) {
        PyObject *o = (PyObject *)&PyBaseObject_Type;
        if ((str_cubin_info = PyUnicode_InternFromString("CubinInfo")) == NULL ||
            (str_arch = PyUnicode_InternFromString("arch")) == NULL ||
            (object_new = PyObject_GetAttrString(o, "__new__")) == NULL)
            return NULL;
    }
    return decode(args[0], args[1], args[2], 0);
}

#if defined(__linux__)
#include <sys/stat.h>

/* file_signs(paths) -> [[type, inode, size, mtime_ns, ctime_ns] or None, ...]: what
 * nbjit.compiler._sig(os.stat(path)) gives for each path (None where it cannot be stat()ed),
 * for the toolchain state's check on a warm start (five stat() calls, without a stat_result
 * each). ValueError for a path that is not a str, or a time beyond a long long of
 * nanoseconds: the caller then asks os.stat. Linux only. */
/* whether seconds times 10^9 (plus the nanoseconds) fit in a long long: years 1678-2262 */
static int in_ns_range(long long sec) {
    return sec > LLONG_MIN / 1000000000LL + 1 && sec < LLONG_MAX / 1000000000LL - 1;
}

PyObject *nbjit_file_signs(PyObject *self, PyObject *paths) {
    PyObject *out, *p, *b, *sig;
    Py_ssize_t n, i;
    struct stat st;
    if (!PyList_CheckExact(paths)) {
        PyErr_SetString(PyExc_ValueError, "file_signs(list of str)");
        return NULL;
    }
    n = PyList_Size(paths);
    out = PyList_New(n);
    if (out == NULL) return NULL;
    for (i = 0; i < n; i++) {
        p = PyList_GetItem(paths, i);
        if (!PyUnicode_CheckExact(p)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "file_signs(list of str)");
            return NULL;
        }
        b = PyUnicode_EncodeFSDefault(p);
        if (b == NULL) { /* (os.stat raises too: no such file) */
            PyErr_Clear();
            Py_INCREF(Py_None);
            PyList_SetItem(out, i, Py_None);
            continue;
        }
        if ((Py_ssize_t)strlen(PyBytes_AsString(b)) != PyBytes_Size(b) || stat(PyBytes_AsString(b), &st) != 0) {
            Py_DECREF(b); /* (a NUL in the path: os.stat's ValueError; any failure: nothing there) */
            Py_INCREF(Py_None);
            PyList_SetItem(out, i, Py_None);
            continue;
        }
        Py_DECREF(b);
        if (!in_ns_range(st.st_mtim.tv_sec) || !in_ns_range(st.st_ctim.tv_sec)) {
            Py_DECREF(out); /* (times a long long of nanoseconds cannot hold: os.stat's ints can) */
            PyErr_SetString(PyExc_ValueError, "a time out of range");
            return NULL;
        }
        sig = Py_BuildValue("[lKLLL]", (long)(st.st_mode & S_IFMT), (unsigned long long)st.st_ino,
                            (long long)st.st_size,
                            (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                            (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec);
        if (sig == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SetItem(out, i, sig);
    }
    return out;
}
#endif
