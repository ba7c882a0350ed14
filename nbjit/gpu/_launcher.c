/* nbjit.gpu._launcher: the launch hot path in C (optional; nbjit runs the same rules in Python
 * when this extension is not built).
 *
 * Launcher(spec) is a configured kernel: calling it with the kernel's arguments packs them into
 * a parameter buffer on the C stack and calls cuLaunchKernel (cuLaunchKernelEx where the launch
 * has attributes). `spec` (nbjit.launch.launchers.LauncherSpec) has, by name:
 *   func, stream  the CUfunction's and CUstream's addresses
 *   grid, block   3 ints each; shared  dynamic shared memory bytes
 *   size       the parameter buffer's size
 *   layout     tuple of (offset, code[, accepted]) per parameter; codes: 'P' 64-bit pointer or
 *              unsigned integer, 'A' a typed pointer (an array's dtype must be in the list
 *              `accepted`, compared by identity; the Python rules append what they find to
 *              fit), 'q' s64, 'I' 'H' 'B' unsigned, 'i' 'h' 'b' signed, 'f' f32, 'd' f64,
 *              '4' '2' '1' a parameter of that many bytes whose type is unknown (cubins),
 *              'Z' a trailing parameter the caller does not pass, left zero (Triton's NULL
 *              scratch pointers),
 *              'N' a Numba array, (offset, 'N', accepted, ndim, itemsize, layout): its 5 + 2*ndim
 *              fields (meminfo 0, parent 0, nitems, itemsize, data, shape, strides: the
 *              array's .shape and .strides, or PyTorch's .stride() times the item size), the
 *              array's dtype in `accepted`, its ndim, and 'C'/'F' contiguity checked,
 *              'M' the same for a numba-cuda-mlir kernel: a memref's 3 + 2*ndim fields (data,
 *              data, offset 0, shape, strides in items),
 *              'X' anything that only the Python rules handle (structs, f16, bf16, ...)
 *   extractors dict {type: callable -> int address, or a tuple of attribute names whose
 *              chain ends in an int-like object} for device arrays (Numba, CuPy, torch, ...)
 *   numbers    dict {type: kind + size} for numpy scalar types: "f4", "i8", "u2", ...
 *   fallback   fallback(args) -> bytes of the whole buffer, or raises (the precise rules)
 *   on_error   on_error(CUresult) raises the launch error, or returns True where the launch
 *              may go again (once): it made a context current in a thread that had none
 *   param_offsets  where each kernel parameter starts, where arguments and parameters are
 *              not one to one (Numba kernels); None: the layout's offsets
 *   attributes bytes: cuLaunchKernelEx's launch attributes (72 bytes each; b"": none)
 * Anything the fast rules do not take exactly goes to `fallback`, so both paths always agree.
 * It never loads libcuda itself: Python hands it the cuLaunchKernel that cuda.bindings'
 * cuGetProcAddress found. Limited API (abi3), Python >= 3.10. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shmem, void *stream, void **params, void **extra);

static launch_fn p_launch = NULL;

/* cuLaunchKernelEx's configuration, laid out as CUlaunchConfig; its attributes are
 * CUlaunchAttribute's 72 bytes each (an id, padding, a 64-byte value), built in Python. */
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shmem;
    void *stream;
    void *attrs;
    unsigned nattrs;
} launch_config;
#define ATTR_WORDS 9 /* 72 bytes */
#define MAX_ATTRS 4
typedef int (*launch_ex_fn)(const launch_config *cfg, void *f, void **params, void **extra);
static launch_ex_fn p_launch_ex = NULL;

typedef int (*ctx_fn)(void **ctx);
static ctx_fn p_ctx_current = NULL;

/* An instantiated graph's kernel node: CUDA_KERNEL_NODE_PARAMS (v2, CUDA 12.0 on). */
typedef struct {
    void *func;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    void **params, **extra;
    void *kern, *ctx;
} kernel_node_params;
typedef int (*node_set_fn)(void *exec, void *node, const kernel_node_params *p);
typedef int (*node_enable_fn)(void *exec, void *node, unsigned on);
static node_set_fn p_node_set = NULL;
static node_enable_fn p_node_enable = NULL;

typedef int (*ctx_set_fn)(void *ctx);
typedef int (*error_fn)(int code, const char **text);
typedef int (*sync_fn)(void *stream);
static ctx_set_fn p_ctx_set = NULL;
static error_fn p_error_name = NULL, p_error_string = NULL;
static sync_fn p_stream_sync = NULL;

/* The driver functions nbjit calls, by name. */
static const struct {
    const char *name;
    void *slot; /* where its address goes */
} ENTRY_POINTS[] = {
    {"cuLaunchKernel", &p_launch},          {"cuLaunchKernelEx", &p_launch_ex},
    {"cuCtxGetCurrent", &p_ctx_current},    {"cuCtxSetCurrent", &p_ctx_set},
    {"cuGraphExecKernelNodeSetParams", &p_node_set}, {"cuGraphNodeSetEnabled", &p_node_enable},
    {"cuGetErrorName", &p_error_name},      {"cuGetErrorString", &p_error_string},
    {"cuStreamSynchronize", &p_stream_sync},
};

/* set_entry_point(name, address): the driver function nbjit calls for `name` (one of
 * ENTRY_POINTS), as cuGetProcAddress gave it. */
static PyObject *set_entry_point(PyObject *self, PyObject *args) {
    const char *name;
    PyObject *addr;
    void *p;
    if (!PyArg_ParseTuple(args, "sO", &name, &addr)) return NULL;
    p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred()) return NULL;
    for (size_t i = 0; i < sizeof ENTRY_POINTS / sizeof ENTRY_POINTS[0]; i++)
        if (strcmp(name, ENTRY_POINTS[i].name) == 0) {
            memcpy(ENTRY_POINTS[i].slot, &p, sizeof p); /* (a function pointer's bits) */
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "no entry point called %s", name);
    return NULL;
}

/* current_context() -> the handle of the context current on this thread (0: none, or CUDA
 * not initialised), or None where the driver reports another error (the caller asks again
 * through cuda.bindings for the message). */
static PyObject *current_context(PyObject *self, PyObject *unused) {
    void *ctx = NULL;
    int r;
    if (p_ctx_current == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nbjit.gpu._launcher: no cuCtxGetCurrent entry point set");
        return NULL;
    }
    r = p_ctx_current(&ctx);
    if (r == 3 /* CUDA_ERROR_NOT_INITIALIZED */) return PyLong_FromLong(0);
    if (r != 0) Py_RETURN_NONE;
    return PyLong_FromVoidPtr(ctx);
}

/* Launch attributes from a bytes object (a multiple of 72 bytes, at most MAX_ATTRS) into
 * `out`, 8-byte aligned as the driver reads them; the count, or -1 with an exception. */
static int read_attrs(PyObject *o, unsigned long long *out) {
    char *bytes;
    Py_ssize_t len;
    if (o == NULL || o == Py_None) return 0;
    if (PyBytes_AsStringAndSize(o, &bytes, &len) < 0) return -1;
    if (len % (ATTR_WORDS * 8) || len > MAX_ATTRS * ATTR_WORDS * 8) {
        PyErr_SetString(PyExc_ValueError, "launch attributes must be up to 4 blocks of 72 bytes");
        return -1;
    }
    if (len && p_launch_ex == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nbjit.gpu._launcher: no cuLaunchKernelEx entry point set");
        return -1;
    }
    memcpy(out, bytes, len);
    return (int)(len / (ATTR_WORDS * 8));
}

/* cuLaunchKernel, or cuLaunchKernelEx where there are attributes (no Python: any thread). */
static int launch_raw(void *f, const unsigned *d, void *stream, void **params, unsigned long long *attrs,
                      int nattrs) {
    if (nattrs == 0) return p_launch(f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, params, NULL);
    launch_config c = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, attrs, (unsigned)nattrs};
    return p_launch_ex(&c, f, params, NULL);
}

/* launch_raw with the GIL released. */
static int launch_any(void *f, const unsigned *d, void *stream, void **params, unsigned long long *attrs,
                      int nattrs) {
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = launch_raw(f, d, stream, params, attrs, nattrs);
    Py_END_ALLOW_THREADS
    return r;
}

static int as_uint(PyObject *o, unsigned *out) {
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_OverflowError, "launch dimension does not fit in 32 bits");
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

/* `n` addresses from Python ints (0: NULL); -1 with the error set. */
static int as_pointers(PyObject *const *args, Py_ssize_t n, void **out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsVoidPtr(args[i]);
        if (out[i] == NULL && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* A launch's 7 dimensions (grid, block, dynamic shared memory bytes); -1 with the error set. */
static int as_dims(PyObject *const *args, unsigned *d) {
    for (int i = 0; i < 7; i++)
        if (as_uint(args[i], &d[i]) < 0) return -1;
    return 0;
}

/* An argument count and a driver entry point checked; -1 with the error set. */
static int check_call(Py_ssize_t nargs, Py_ssize_t want, const char *usage, void *entry, const char *entry_name) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return -1;
    }
    if (entry == NULL) {
        PyErr_Format(PyExc_RuntimeError, "nbjit.gpu._launcher: no %s set", entry_name);
        return -1;
    }
    return 0;
}

/* launch(func, gx, gy, gz, bx, by, bz, shared, stream, params[, attributes]) -> CUresult as int. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned d[7];
    unsigned long long attrs[MAX_ATTRS * ATTR_WORDS];
    void *f, *stream, *params;
    int i, r, nattrs = 0;
    if (nargs != 10 && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "launch takes 10 or 11 arguments");
        return NULL;
    }
    if (nargs == 11 && (nattrs = read_attrs(args[10], attrs)) < 0) return NULL;
    if (p_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nbjit.gpu._launcher: no entry point set");
        return NULL;
    }
    f = PyLong_AsVoidPtr(args[0]);
    if (f == NULL && PyErr_Occurred()) return NULL;
    for (i = 0; i < 7; i++)
        if (as_uint(args[1 + i], &d[i]) < 0) return NULL;
    stream = PyLong_AsVoidPtr(args[8]);
    if (stream == NULL && PyErr_Occurred()) return NULL;
    params = PyLong_AsVoidPtr(args[9]);
    if (params == NULL && PyErr_Occurred()) return NULL;
    r = launch_any(f, d, stream, (void **)params, attrs, nattrs);
    return PyLong_FromLong(r);
}

/* set_kernel_node(graph_exec, node, func, gx, gy, gz, bx, by, bz, shared, params) -> CUresult:
 * an instantiated graph's kernel node given a configuration and the void* array at `params`. */
static PyObject *set_kernel_node(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *h[3], *params;
    unsigned d[7];
    if (check_call(nargs, 11, "set_kernel_node", p_node_set, "cuGraphExecKernelNodeSetParams") < 0 ||
        as_pointers(args, 3, h) < 0 || as_dims(args + 3, d) < 0 || as_pointers(args + 10, 1, &params) < 0)
        return NULL;
    kernel_node_params p = {h[2], d[0], d[1], d[2], d[3], d[4], d[5], d[6], (void **)params, NULL, NULL, NULL};
    return PyLong_FromLong(p_node_set(h[0], h[1], &p));
}

/* set_node_enabled(graph_exec, node, on) -> CUresult */
static PyObject *set_node_enabled(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *h[2];
    unsigned on;
    if (check_call(nargs, 3, "set_node_enabled", p_node_enable, "cuGraphNodeSetEnabled") < 0 ||
        as_pointers(args, 2, h) < 0 || as_uint(args[2], &on) < 0)
        return NULL;
    return PyLong_FromLong(p_node_enable(h[0], h[1], on));
}

/* ------------------------------------------------------------------ Launcher */

#define STACK_BYTES 4096
#define STACK_PARAMS 512

typedef struct entry_facts entry_facts; /* the C entry point's facts (below) */

typedef struct {
    PyObject_HEAD
    void *func, *stream;
    unsigned dims[7];
    Py_ssize_t n, nargs, size; /* parameters; arguments expected (n less the 'Z' ones) */
    Py_ssize_t *offsets;
    char *codes;
    PyObject **accepted; /* per parameter: a list (code 'A') or NULL */
    int *ndim, *itemsize; /* per parameter, codes 'N' and 'M' */
    char *contig;         /* per parameter, codes 'N' and 'M': 'C', 'F' or 'A' */
    Py_ssize_t nparams;   /* kernel parameters (pointers handed to the driver) */
    Py_ssize_t *param_offsets;
    Py_ssize_t fallbacks; /* calls the fast rules handed to `fallback` */
    PyObject *extractors, *numbers, *fallback, *on_error, *dict;
    int nattrs;           /* launch attributes: cuLaunchKernelEx where there are any */
    unsigned long long attrs[MAX_ATTRS * ATTR_WORDS];
    entry_facts *facts;   /* the C entry point's checks and messages (NULL: not an entry) */
} Launcher;

static void free_facts(entry_facts *f);
static int init_entry(Launcher *self, PyObject *spec);

static PyObject *str_dtype = NULL, *str_shape = NULL, *str_strides = NULL, *str_stride = NULL;

static void free_accepted(Launcher *self) {
    Py_ssize_t i;
    PyMem_Free(self->ndim);
    PyMem_Free(self->itemsize);
    PyMem_Free(self->contig);
    PyMem_Free(self->param_offsets);
    self->ndim = self->itemsize = NULL;
    self->contig = NULL;
    self->param_offsets = NULL;
    if (self->accepted == NULL) return;
    for (i = 0; i < self->n; i++) Py_CLEAR(self->accepted[i]);
    PyMem_Free(self->accepted);
    self->accepted = NULL;
}

static void launcher_dealloc(PyObject *op) {
    Launcher *self = (Launcher *)op;
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    free_facts(self->facts);
    self->facts = NULL;
    free_accepted(self);
    PyMem_Free(self->offsets);
    PyMem_Free(self->codes);
    Py_CLEAR(self->extractors);
    Py_CLEAR(self->numbers);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->dict);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(op);
    Py_DECREF(tp);
}

static int launcher_traverse(PyObject *op, visitproc visit, void *arg) {
    Launcher *self = (Launcher *)op;
    Py_ssize_t i;
    if (self->accepted)
        for (i = 0; i < self->n; i++) Py_VISIT(self->accepted[i]);
    Py_VISIT(self->extractors);
    Py_VISIT(self->numbers);
    Py_VISIT(self->fallback);
    Py_VISIT(self->on_error);
    Py_VISIT(self->dict);
    Py_VISIT(Py_TYPE(op));
    return 0;
}

static int launcher_clear(PyObject *op) {
    Launcher *self = (Launcher *)op;
    Py_ssize_t i;
    if (self->accepted)
        for (i = 0; i < self->n; i++) Py_CLEAR(self->accepted[i]);
    Py_CLEAR(self->extractors);
    Py_CLEAR(self->numbers);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->dict);
    return 0;
}

/* Replace an owned reference in `*slot` with `v` (a new reference, stolen). */
static void set_ref(PyObject **slot, PyObject *v) {
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

/* The attribute `name` of a launcher spec (a new reference), or NULL with an error naming it. */
static PyObject *spec_get(PyObject *spec, const char *name) {
    PyObject *v = PyObject_GetAttrString(spec, name);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "a launcher spec needs the attribute %s", name);
    }
    return v;
}

/* Spec attribute `name`, a tuple of `n` 32-bit unsigned ints, into out[]. */
static int spec_uints(PyObject *spec, const char *name, Py_ssize_t n, unsigned *out) {
    PyObject *t = spec_get(spec, name);
    Py_ssize_t i;
    int r = 0;
    if (t == NULL) return -1;
    if (!PyTuple_Check(t) || PyTuple_Size(t) != n) {
        PyErr_Format(PyExc_TypeError, "launcher spec: %s must be a tuple of %zd ints", name, n);
        r = -1;
    }
    for (i = 0; r == 0 && i < n; i++) r = as_uint(PyTuple_GetItem(t, i), &out[i]);
    Py_DECREF(t);
    return r;
}

/* Spec attribute `name`, an int address, into *out. */
static int spec_address(PyObject *spec, const char *name, void **out) {
    PyObject *v = spec_get(spec, name);
    if (v == NULL) return -1;
    *out = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* grid, block, shared: self->dims; func and stream: their addresses. */
static int init_config(Launcher *self, PyObject *spec) {
    PyObject *shared;
    int r;
    if (spec_uints(spec, "grid", 3, self->dims) < 0 || spec_uints(spec, "block", 3, self->dims + 3) < 0) return -1;
    if ((shared = spec_get(spec, "shared")) == NULL) return -1;
    r = as_uint(shared, &self->dims[6]);
    Py_DECREF(shared);
    if (r < 0) return -1;
    return spec_address(spec, "func", &self->func) < 0 || spec_address(spec, "stream", &self->stream) < 0 ? -1 : 0;
}

/* Parameter i's layout entry, (offset, code[, accepted[, ndim, itemsize, layout]]), into the
 * per-parameter arrays; self->size is known. */
static int init_param(Launcher *self, Py_ssize_t i, PyObject *item) {
    PyObject *acc = NULL;
    const char *code, *lay = "A";
    Py_ssize_t len, laylen = 1;
    if (!item || !PyTuple_Check(item) ||
        !PyArg_ParseTuple(item, "ns#|Oiis#", &self->offsets[i], &code, &len, &acc, &self->ndim[i], &self->itemsize[i],
                          &lay, &laylen)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a layout entry must be a tuple");
        return -1;
    }
    self->contig[i] = lay[0];
    if ((code[0] == 'N' || code[0] == 'M') &&
        (self->ndim[i] < 0 || self->ndim[i] > 32 || self->itemsize[i] <= 0 ||
         self->offsets[i] + 8 * ((code[0] == 'N' ? 5 : 3) + 2 * (Py_ssize_t)self->ndim[i]) > self->size)) {
        PyErr_SetString(PyExc_ValueError, "bad Numba array layout entry");
        return -1;
    }
    if (len != 1 || self->offsets[i] < 0 || self->offsets[i] >= self->size) {
        PyErr_SetString(PyExc_ValueError, "bad layout entry");
        return -1;
    }
    self->codes[i] = code[0];
    if (code[0] != 'Z' && i > 0 && self->codes[i - 1] == 'Z') {
        PyErr_SetString(PyExc_ValueError, "'Z' parameters must come last");
        return -1;
    }
    if (code[0] != 'Z') self->nargs = i + 1;
    if (code[0] == 'A' || code[0] == 'N' || code[0] == 'M') {
        if (acc == NULL || !PyList_Check(acc)) {
            PyErr_SetString(PyExc_TypeError, "a typed pointer ('A') needs its list of accepted dtypes");
            return -1;
        }
        Py_INCREF(acc);
        self->accepted[i] = acc;
    }
    return 0;
}

/* size and layout: the buffer's size, and per parameter its offset, code and checks. */
static int init_layout(Launcher *self, PyObject *spec) {
    PyObject *layout, *size;
    Py_ssize_t i;
    int r = 0;
    if ((size = spec_get(spec, "size")) == NULL) return -1;
    self->size = PyLong_AsSsize_t(size);
    Py_DECREF(size);
    if (self->size == -1 && PyErr_Occurred()) return -1;
    if (self->size < 0 || self->size > 65536) {
        PyErr_SetString(PyExc_ValueError, "parameter buffer size out of range");
        return -1;
    }
    if ((layout = spec_get(spec, "layout")) == NULL) return -1;
    if (!PyTuple_Check(layout)) {
        Py_DECREF(layout);
        PyErr_SetString(PyExc_TypeError, "launcher spec: layout must be a tuple");
        return -1;
    }
    free_accepted(self);
    PyMem_Free(self->offsets);
    PyMem_Free(self->codes);
    self->n = PyTuple_Size(layout);
    self->nargs = 0;
    self->offsets = PyMem_Malloc(sizeof(Py_ssize_t) * (self->n + 1));
    self->codes = PyMem_Malloc(self->n + 1);
    self->accepted = PyMem_Calloc(self->n + 1, sizeof(PyObject *));
    self->ndim = PyMem_Calloc(self->n + 1, sizeof(int));
    self->itemsize = PyMem_Calloc(self->n + 1, sizeof(int));
    self->contig = PyMem_Calloc(self->n + 1, 1);
    if (!self->offsets || !self->codes || !self->accepted || !self->ndim || !self->itemsize || !self->contig) {
        PyErr_NoMemory();
        r = -1;
    }
    for (i = 0; r == 0 && i < self->n; i++) r = init_param(self, i, PyTuple_GetItem(layout, i));
    Py_DECREF(layout);
    return r;
}

/* param_offsets: where each kernel parameter starts (None: the layout's offsets). */
static int init_param_offsets(Launcher *self, PyObject *spec) {
    PyObject *poffs = spec_get(spec, "param_offsets");
    Py_ssize_t i;
    int r = 0;
    if (poffs == NULL) return -1;
    if (poffs == Py_None) {
        self->nparams = self->n;
    } else if (!PyTuple_Check(poffs)) {
        PyErr_SetString(PyExc_TypeError, "launcher spec: param_offsets must be a tuple or None");
        r = -1;
    } else {
        self->nparams = PyTuple_Size(poffs);
        self->param_offsets = PyMem_Malloc(sizeof(Py_ssize_t) * (self->nparams + 1));
        if (!self->param_offsets) {
            PyErr_NoMemory();
            r = -1;
        }
        for (i = 0; r == 0 && i < self->nparams; i++) {
            self->param_offsets[i] = PyLong_AsSsize_t(PyTuple_GetItem(poffs, i));
            if (self->param_offsets[i] == -1 && PyErr_Occurred()) {
                r = -1;
            } else if (self->param_offsets[i] < 0 || self->param_offsets[i] >= self->size) {
                PyErr_SetString(PyExc_ValueError, "parameter offset out of range");
                r = -1;
            }
        }
    }
    Py_DECREF(poffs);
    return r;
}

/* extractors, numbers (dicts), fallback, on_error (callables): kept by reference. */
static int init_callbacks(Launcher *self, PyObject *spec) {
    PyObject *extractors = spec_get(spec, "extractors"), *numbers = spec_get(spec, "numbers");
    PyObject *fallback = spec_get(spec, "fallback"), *on_error = spec_get(spec, "on_error");
    if (!extractors || !numbers || !fallback || !on_error) goto fail;
    if (!PyDict_Check(extractors) || !PyDict_Check(numbers)) {
        PyErr_SetString(PyExc_TypeError, "launcher spec: extractors and numbers must be dicts");
        goto fail;
    }
    if (!PyCallable_Check(fallback) || !PyCallable_Check(on_error)) {
        PyErr_SetString(PyExc_TypeError, "launcher spec: fallback and on_error must be callable");
        goto fail;
    }
    set_ref(&self->extractors, extractors);
    set_ref(&self->numbers, numbers);
    set_ref(&self->fallback, fallback);
    set_ref(&self->on_error, on_error);
    return 0;
fail:
    Py_XDECREF(extractors);
    Py_XDECREF(numbers);
    Py_XDECREF(fallback);
    Py_XDECREF(on_error);
    return -1;
}

/* attributes: cuLaunchKernelEx's launch attributes, copied in (none: cuLaunchKernel). */
static int init_attrs(Launcher *self, PyObject *spec) {
    PyObject *attrs = spec_get(spec, "attributes");
    if (attrs == NULL) return -1;
    self->nattrs = read_attrs(attrs, self->attrs);
    Py_DECREF(attrs);
    if (self->nattrs < 0) {
        self->nattrs = 0;
        return -1;
    }
    return 0;
}

/* Launcher(spec): see the top of this file for what `spec` holds. */
static int launcher_init(PyObject *op, PyObject *args, PyObject *kwds) {
    Launcher *self = (Launcher *)op;
    PyObject *spec;
    if (kwds != NULL && PyDict_Size(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Launcher takes one spec, no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O:Launcher", &spec)) return -1;
    if (init_config(self, spec) < 0 || init_layout(self, spec) < 0 || init_param_offsets(self, spec) < 0 ||
        init_callbacks(self, spec) < 0 || init_attrs(self, spec) < 0 || init_entry(self, spec) < 0)
        return -1;
    return 0;
}

/* The device address an object stands for, via the extractor registered for its type.
 * Returns 0 and sets *ok = 0 where no fast rule applies (no Python error left set). */
static unsigned long long extract(Launcher *self, PyObject *o, int *ok) {
    PyObject *how = PyDict_GetItem(self->extractors, (PyObject *)Py_TYPE(o)); /* borrowed */
    PyObject *v = NULL;
    unsigned long long r;
    *ok = 0;
    if (how == NULL) return 0;
    if (PyTuple_Check(how)) {
        Py_ssize_t i, k = PyTuple_Size(how);
        Py_INCREF(o);
        v = o;
        for (i = 0; i < k && v; i++) {
            PyObject *next = PyObject_GetAttr(v, PyTuple_GetItem(how, i));
            Py_DECREF(v);
            v = next;
        }
    } else {
        v = PyObject_CallFunctionObjArgs(how, o, NULL);
    }
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (!PyLong_Check(v)) {
        PyObject *idx = PyNumber_Index(v);
        Py_DECREF(v);
        if (idx == NULL) {
            PyErr_Clear();
            return 0;
        }
        v = idx;
    }
    r = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (r == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *ok = 1;
    return r;
}

/* The kind letter ('f', 'i', 'u') and byte size of a numpy scalar type's entry. */
static Py_UCS4 number_kind(PyObject *kind) {
    Py_UCS4 c = PyUnicode_ReadChar(kind, 0);
    if (c == (Py_UCS4)-1) PyErr_Clear();
    return c;
}

static int number_size(PyObject *kind) {
    Py_UCS4 c = PyUnicode_ReadChar(kind, 1);
    if (c == (Py_UCS4)-1) {
        PyErr_Clear();
        return 0;
    }
    return (int)(c - '0');
}

/* Whether an array's dtype (or, for objects without one, its type) is in `accepted`. */
static int dtype_accepted(PyObject *o, PyObject *accepted) {
    PyObject *d = PyObject_GetAttr(o, str_dtype);
    Py_ssize_t i, n = PyList_Size(accepted);
    int found = 0;
    if (d == NULL) {
        PyErr_Clear();
        d = (PyObject *)Py_TYPE(o);
        Py_INCREF(d);
    }
    for (i = 0; i < n; i++) {
        if (PyList_GetItem(accepted, i) == d) {
            found = 1;
            break;
        }
    }
    Py_DECREF(d);
    return found;
}

/* An int-like object as a Python int (new reference), or NULL (no error set). */
static PyObject *as_pyint(Launcher *self, PyObject *o) {
    PyObject *kind;
    if (PyLong_CheckExact(o)) {
        Py_INCREF(o);
        return o;
    }
    kind = PyDict_GetItem(self->numbers, (PyObject *)Py_TYPE(o));
    if (kind == NULL || number_kind(kind) == 'f') return NULL;
    o = PyNumber_Index(o);
    if (o == NULL) PyErr_Clear();
    return o;
}

/* Bits of an int that fit `size` bytes as either signed or unsigned (the Python rule for a
 * parameter of unknown type), or -1 (no error set). */
static int pack_unknown_int(PyObject *i, int size, unsigned char *dst) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    unsigned long long u;
    if (overflow > 0) {
        PyErr_Clear();
        if (size < 8) return -1;
        u = PyLong_AsUnsignedLongLong(i);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    } else {
        if (overflow < 0 || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
        if (size < 8) {
            long long lo = -(1LL << (size * 8 - 1)), hi = (1LL << (size * 8)) - 1;
            if (v < lo || v > hi) return -1;
        }
        u = (unsigned long long)v;
    }
    memcpy(dst, &u, size); /* little-endian: the low bytes */
    return 0;
}

/* A tuple of `nd` ints into out[]; -1 where it is not one (no error set). */
static int int_tuple(PyObject *t, int nd, long long *out) {
    Py_ssize_t k;
    if (t == NULL || !PyTuple_Check(t) || PyTuple_Size(t) != nd) return -1;
    for (k = 0; k < nd; k++) {
        PyObject *x = PyTuple_GetItem(t, k);
        int overflow = 0;
        if (!PyLong_Check(x)) return -1;
        out[k] = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || (out[k] == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
    }
    return 0;
}

/* Whether strides make an array contiguous in C or Fortran order (dimensions of extent 1
 * do not count, as in numpy). */
static int contiguous(const long long *shape, const long long *strides, int nd, int itemsize, char order) {
    long long expect = itemsize;
    int k;
    for (k = 0; k < nd; k++)
        if (shape[k] == 0) return 1; /* an empty array is contiguous in any order */
    for (k = 0; k < nd; k++) {
        int d = order == 'C' ? nd - 1 - k : k;
        if (shape[d] != 1 && strides[d] != expect) return 0;
        expect *= shape[d];
    }
    return 1;
}

/* What keeps an array of these extents and strides (in bytes) from being passed for array
 * parameter `idx` (codes 'N', 'M'): ARRAY_OK, or what is wrong. */
enum { ARRAY_OK, ARRAY_NEGATIVE, ARRAY_NOT_CONTIGUOUS, ARRAY_STRIDES_NOT_ITEMS };

static int array_problem(Launcher *self, Py_ssize_t idx, const long long *shape, const long long *strides,
                         int memref) {
    int nd = self->ndim[idx], k;
    for (k = 0; k < nd; k++)
        if (shape[k] < 0) return ARRAY_NEGATIVE;
    if (self->contig[idx] != 'A' && !contiguous(shape, strides, nd, self->itemsize[idx], self->contig[idx]))
        return ARRAY_NOT_CONTIGUOUS;
    if (memref)
        for (k = 0; k < nd; k++)
            if (strides[k] % self->itemsize[idx]) return ARRAY_STRIDES_NOT_ITEMS;
    return ARRAY_OK;
}

/* An array for parameter `idx` into `dst` (array_problem said ARRAY_OK): meminfo 0, parent 0,
 * nitems, itemsize, data, shape, strides; or, `memref` set (numba-cuda-mlir), data, data,
 * offset 0, shape, strides in items. */
static void write_array(Launcher *self, Py_ssize_t idx, unsigned long long data, const long long *shape,
                        const long long *strides, unsigned char *dst, int memref) {
    int nd = self->ndim[idx], k;
    long long f[5], items[32];
    if (memref) {
        for (k = 0; k < nd; k++) items[k] = strides[k] / self->itemsize[idx];
        f[2] = 0;
        memcpy(&f[0], &data, 8);
        memcpy(&f[1], &data, 8);
        memcpy(dst, f, 24);
        memcpy(dst + 24, shape, 8 * (size_t)nd);
        memcpy(dst + 24 + 8 * (size_t)nd, items, 8 * (size_t)nd);
        return;
    }
    f[0] = 0;
    f[1] = 0;
    f[2] = 1;
    for (k = 0; k < nd; k++) f[2] *= shape[k];
    f[3] = self->itemsize[idx];
    memcpy(&f[4], &data, 8);
    memcpy(dst, f, 40);
    memcpy(dst + 40, shape, 8 * (size_t)nd);
    memcpy(dst + 40 + 8 * (size_t)nd, strides, 8 * (size_t)nd);
}

/* A Numba array argument (a Python object): its address, dtype, shape and strides read and
 * checked, then written (write_array); 0 where the Python rules must decide. */
static int pack_numba_array(Launcher *self, Py_ssize_t idx, PyObject *o, unsigned char *dst, int memref) {
    int nd = self->ndim[idx], ok = 1, k, in_items = 0;
    long long shape[32], strides[32];
    PyObject *t;
    unsigned long long data = extract(self, o, &ok);
    if (!ok || !dtype_accepted(o, self->accepted[idx])) return 0;
    t = PyObject_GetAttr(o, str_shape);
    if (t == NULL) PyErr_Clear();
    k = int_tuple(t, nd, shape);
    Py_XDECREF(t);
    if (k < 0) return 0;
    t = PyObject_GetAttr(o, str_strides);
    if (t == NULL) { /* PyTorch's tensors: stride(), counted in items */
        PyObject *m;
        PyErr_Clear();
        m = PyObject_GetAttr(o, str_stride);
        if (m == NULL) PyErr_Clear();
        t = m == NULL ? NULL : PyObject_CallObject(m, NULL);
        Py_XDECREF(m);
        if (t == NULL) PyErr_Clear();
        in_items = 1;
    }
    k = int_tuple(t, nd, strides);
    Py_XDECREF(t);
    if (k < 0) return 0;
    if (in_items)
        for (k = 0; k < nd; k++) {
            if (strides[k] > LLONG_MAX / 16 || strides[k] < -(LLONG_MAX / 16)) return 0; /* the Python rules */
            strides[k] *= self->itemsize[idx];
        }
    if (array_problem(self, idx, shape, strides, memref) != ARRAY_OK) return 0; /* the Python rules say what */
    write_array(self, idx, data, shape, strides, dst, memref);
    return 1;
}

/* A double into 4 bytes as a float, rounded to nearest as struct.pack rounds it; 0 where a finite
 * value rounds to infinity (the precise rules say so). */
static int store_f32(double v, unsigned char *dst) {
    float x = (float)v;
    if (isinf(x) && isfinite(v)) return 0;
    memcpy(dst, &x, 4);
    return 1;
}

/* Codes '4' '2' '1', a parameter of `size` bytes and unknown type: an int's bits (signed or
 * unsigned), a float into 4 bytes, a numpy scalar of that size. */
static int pack_unknown(Launcher *self, int size, PyObject *o, unsigned char *dst) {
    PyObject *kind, *i;
    int r;
    if (PyLong_CheckExact(o)) return pack_unknown_int(o, size, dst) == 0;
    if (PyFloat_CheckExact(o)) return size == 4 && store_f32(PyFloat_AsDouble(o), dst);
    kind = PyDict_GetItem(self->numbers, (PyObject *)Py_TYPE(o));
    if (kind == NULL || number_size(kind) != size) return 0;
    if (number_kind(kind) == 'f') {
        double v;
        if (size != 4) return 0;
        v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return store_f32(v, dst);
    }
    i = PyNumber_Index(o);
    if (i == NULL) {
        PyErr_Clear();
        return 0;
    }
    r = pack_unknown_int(i, size, dst);
    Py_DECREF(i);
    return r == 0;
}

/* Codes 'P' and 'A', a pointer: an int address, None, an array ('A': of an accepted dtype). */
static int pack_pointer(Launcher *self, Py_ssize_t idx, char code, PyObject *o, unsigned char *dst) {
    unsigned long long v;
    int ok = 1;
    if (PyLong_CheckExact(o)) {
        v = PyLong_AsUnsignedLongLong(o);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else if (o == Py_None) {
        v = 0;
    } else {
        v = extract(self, o, &ok);
        if (ok && code == 'A' && !dtype_accepted(o, self->accepted[idx])) return 0;
        if (!ok) {
            PyObject *i = as_pyint(self, o);
            if (i == NULL) return 0;
            v = PyLong_AsUnsignedLongLong(i);
            Py_DECREF(i);
            if (v == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        }
    }
    memcpy(dst, &v, 8);
    return 1;
}

/* Codes 'q' 'i' 'h' 'b' (signed) and 'I' 'H' 'B' (unsigned): `v` into `dst` where it is in the
 * code's range; 0 where it is not. */
static int store_int(char code, long long v, unsigned char *dst) {
    switch (code) {
    case 'q': memcpy(dst, &v, 8); return 1;
    case 'i': if (v < INT32_MIN || v > INT32_MAX) return 0; { int32_t x = (int32_t)v; memcpy(dst, &x, 4); } return 1;
    case 'h': if (v < INT16_MIN || v > INT16_MAX) return 0; { int16_t x = (int16_t)v; memcpy(dst, &x, 2); } return 1;
    case 'b': if (v < INT8_MIN || v > INT8_MAX) return 0; { int8_t x = (int8_t)v; memcpy(dst, &x, 1); } return 1;
    case 'I': if (v < 0 || v > UINT32_MAX) return 0; { uint32_t x = (uint32_t)v; memcpy(dst, &x, 4); } return 1;
    case 'H': if (v < 0 || v > UINT16_MAX) return 0; { uint16_t x = (uint16_t)v; memcpy(dst, &x, 2); } return 1;
    case 'B': if (v < 0 || v > UINT8_MAX) return 0; { uint8_t x = (uint8_t)v; memcpy(dst, &x, 1); } return 1;
    }
    return 0;
}

/* The integer codes: an int-like Python object in range (store_int). */
static int pack_int(Launcher *self, char code, PyObject *o, unsigned char *dst) {
    PyObject *i = as_pyint(self, o);
    int overflow = 0;
    long long v;
    if (i == NULL) return 0;
    v = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return store_int(code, v, dst);
}

/* Codes 'f' (f32) and 'd' (f64): a Python float or int, or a numpy number. */
static int pack_float(Launcher *self, char code, PyObject *o, unsigned char *dst) {
    double v;
    if (PyFloat_CheckExact(o)) {
        v = PyFloat_AsDouble(o);
    } else if (PyLong_CheckExact(o)) {
        v = PyLong_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        if (PyDict_GetItem(self->numbers, (PyObject *)Py_TYPE(o)) == NULL) return 0;
        v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    if (code == 'f') return store_f32(v, dst); /* overflow: 0, and the precise rules say so */
    memcpy(dst, &v, 8);
    return 1;
}

/* Argument `o` of parameter `idx` into `dst` by the parameter's code: 1, or 0 where the fast
 * rules do not apply (the Python rules then decide; no Python error left set). */
static int pack_one(Launcher *self, Py_ssize_t idx, char code, PyObject *o, unsigned char *dst) {
    switch (code) {
    case '4': case '2': case '1': return pack_unknown(self, code - '0', o, dst);
    case 'N': return pack_numba_array(self, idx, o, dst, 0);
    case 'M': return pack_numba_array(self, idx, o, dst, 1);
    case 'A': case 'P': return pack_pointer(self, idx, code, o, dst);
    case 'q': case 'i': case 'h': case 'b':
    case 'I': case 'H': case 'B': return pack_int(self, code, o, dst);
    case 'f': case 'd': return pack_float(self, code, o, dst);
    default: return 0;
    }
}

/* Pack `args` into `buf` (self->size bytes): the fast rules, else the precise Python rules
 * (`fallback`); 0, or -1 with the error set. */
static int pack_all(Launcher *self, PyObject *args, unsigned char *buf) {
    Py_ssize_t i, nargs = PyTuple_Size(args);
    int fast = 1;
    if (nargs != self->nargs) {
        fast = 0;
    } else {
        if (self->size) memset(buf, 0, self->size);
        for (i = 0; i < self->nargs; i++) {
            if (!pack_one(self, i, self->codes[i], PyTuple_GetItem(args, i), buf + self->offsets[i])) {
                fast = 0;
                break;
            }
        }
    }
    if (fast) return 0;
    self->fallbacks++;
    /* the precise rules: they pack what the fast rules could not, or raise */
    char *bytes;
    Py_ssize_t len;
    int r = -1;
    PyObject *packed = PyObject_CallFunctionObjArgs(self->fallback, args, NULL);
    if (packed == NULL) return -1;
    if (PyBytes_AsStringAndSize(packed, &bytes, &len) < 0) goto out;
    if (len != self->size) {
        PyErr_SetString(PyExc_ValueError, "fallback packed a buffer of the wrong size");
        goto out;
    }
    if (len) memcpy(buf, bytes, len);
    r = 0;
out:
    Py_DECREF(packed);
    return r;
}

static void point_into(Launcher *self, unsigned char *buf, void **ptrs) {
    Py_ssize_t i;
    if (self->param_offsets)
        for (i = 0; i < self->nparams; i++) ptrs[i] = buf + self->param_offsets[i];
    else
        for (i = 0; i < self->n; i++) ptrs[i] = buf + self->offsets[i];
}

static PyObject *launcher_call(PyObject *op, PyObject *args, PyObject *kwds) {
    Launcher *self = (Launcher *)op;
    unsigned char stack_buf[STACK_BYTES];
    void *stack_ptrs[STACK_PARAMS];
    unsigned char *buf = stack_buf;
    void **ptrs = stack_ptrs;
    int r;
    PyObject *result = NULL;

    if (kwds != NULL && PyDict_Size(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "a kernel launch takes no keyword arguments");
        return NULL;
    }
    if (p_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nbjit.gpu._launcher: no entry point set");
        return NULL;
    }
    if (self->size > STACK_BYTES) buf = PyMem_Malloc(self->size);
    if (self->nparams > STACK_PARAMS) ptrs = PyMem_Malloc(sizeof(void *) * self->nparams);
    if (buf == NULL || ptrs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (pack_all(self, args, buf) < 0) goto done;
    point_into(self, buf, ptrs);
    /* on a failure, on_error raises, or returns True once it has put right what failed (a
     * thread with no current context): then the launch goes again, once */
    for (int attempt = 0;; attempt++) {
        r = launch_any(self->func, self->dims, self->stream, self->nparams ? ptrs : NULL, self->attrs,
                       self->nattrs);
        if (r == 0) break;
        PyObject *code = PyLong_FromLong(r);
        if (code == NULL) goto done;
        PyObject *x = PyObject_CallFunctionObjArgs(self->on_error, code, NULL);
        Py_DECREF(code);
        int again = x == Py_True && attempt == 0;
        Py_XDECREF(x);
        if (!again) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "kernel launch failed");
            goto done;
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    if (buf != stack_buf) PyMem_Free(buf);
    if (ptrs != stack_ptrs) PyMem_Free(ptrs);
    return result;
}

/* set_node(graph_exec, node, args, buf, buf_size) -> CUresult: an instantiated graph's kernel node
 * given this launcher's kernel and configuration and `args`, packed by the same rules; where the
 * driver takes them, they are copied to the caller's buffer at address `buf` (`buf_size` bytes, at
 * least the kernel's parameter buffer): the node's arguments as they now are. */
static PyObject *launcher_set_node(PyObject *op, PyObject *const *argv, Py_ssize_t nargs) {
    Launcher *self = (Launcher *)op;
    unsigned char stack_buf[STACK_BYTES];
    void *stack_ptrs[STACK_PARAMS];
    unsigned char *tmp = stack_buf;
    void **ptrs = stack_ptrs, *exec, *node, *buf;
    Py_ssize_t buf_size;
    PyObject *result = NULL;
    if (nargs != 5 || !PyTuple_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "set_node(graph_exec, node, args: tuple, buf, buf_size)");
        return NULL;
    }
    if (p_node_set == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nbjit.gpu._launcher: no cuGraphExecKernelNodeSetParams set");
        return NULL;
    }
    exec = PyLong_AsVoidPtr(argv[0]);
    node = PyLong_AsVoidPtr(argv[1]);
    buf = PyLong_AsVoidPtr(argv[3]);
    buf_size = PyLong_AsSsize_t(argv[4]);
    if (PyErr_Occurred()) return NULL;
    if (buf == NULL || buf_size < self->size) {
        PyErr_SetString(PyExc_ValueError, "set_node: the node's buffer is smaller than the kernel's parameters");
        return NULL;
    }
    if (self->size > STACK_BYTES) tmp = PyMem_Malloc(self->size);
    if (self->nparams > STACK_PARAMS) ptrs = PyMem_Malloc(sizeof(void *) * self->nparams);
    if (tmp == NULL || ptrs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (pack_all(self, argv[2], tmp) < 0) goto done;
    point_into(self, tmp, ptrs);
    kernel_node_params p = {self->func, self->dims[0], self->dims[1], self->dims[2], self->dims[3], self->dims[4],
                            self->dims[5], self->dims[6], self->nparams ? ptrs : NULL, NULL, NULL, NULL};
    int r = p_node_set(exec, node, &p);
    if (r == 0 && self->size) memcpy(buf, tmp, self->size);
    result = PyLong_FromLong(r);
done:
    if (tmp != stack_buf) PyMem_Free(tmp);
    if (ptrs != stack_ptrs) PyMem_Free(ptrs);
    return result;
}

/* pack(args) -> bytes: the fast rules alone (None where they do not apply); for tests. */
static PyObject *launcher_pack(PyObject *op, PyObject *args) {
    Launcher *self = (Launcher *)op;
    PyObject *out;
    Py_ssize_t i;
    unsigned char *buf;
    if (!PyTuple_Check(args) || PyTuple_Size(args) != self->nargs) Py_RETURN_NONE;
    buf = PyMem_Calloc(self->size ? self->size : 1, 1);
    if (!buf) return PyErr_NoMemory();
    for (i = 0; i < self->nargs; i++) {
        if (!pack_one(self, i, self->codes[i], PyTuple_GetItem(args, i), buf + self->offsets[i])) {
            PyMem_Free(buf);
            Py_RETURN_NONE;
        }
    }
    out = PyBytes_FromStringAndSize((char *)buf, self->size);
    PyMem_Free(buf);
    return out;
}

/* ------------------------------------------------------------------ the C entry point
 * A launcher made with entry facts (spec.entry, kernel.c_entry) launches from compiled code
 * with no Python at all: nbjit_launch(kernel, dims, forms, stream, args, nargs, message, size).
 * `args` is cuLaunchKernel's array of void*, one per argument, each pointing to the argument
 * in the form its parameter's class takes (nbjit/launch/entry.py documents the ABI):
 *   a pointer ('P' 'A')        a uint64 address
 *   an integer (codes below)   an int64 (a uint64 for .u64), checked against the parameter's type
 *   'f' 'd'                    a double ('f': one that fits a float)
 *   'N' 'M' (an array)         a view: int64 data, int64 ndim, ndim extents, ndim strides in bytes
 *   'X'                        the parameter's own bytes
 * The checks and their messages are the Python rules' (launch/arguments.py, launch/config.py,
 * launchers.launch_error), word for word. */

struct entry_facts {
    char *label;          /* repr() of the kernel's name, as messages quote it */
    char *signature;      /* name(parameters) */
    char **prefix;        /* per parameter: "kernel 'k', parameter i (name, kind)" */
    char **type;          /* per parameter: its PTX type ("s32", "b64", "unknown"), "ptr" for pointers */
    char **text;          /* per parameter: an array parameter's type as messages write it */
    Py_ssize_t *size;     /* per parameter: its bytes */
    long long *lo;        /* per parameter: the integers its rule takes, lo to top (int_range) */
    unsigned long long *top;
    void *ctx;            /* the kernel's context: made current in a thread that has none */
    long long static_shared, max_optin, max_threads;
    long long cluster[3]; /* the kernel's own cluster shape (0: none) */
    char *sticky_hint;    /* what follows an error that leaves the process unable to use CUDA */
    int sticky[16], nsticky;
    Py_ssize_t n;         /* parameters (the per-parameter arrays' length) */
};

/* The values parameter i's integer rule takes (launch/arguments.py: _Rule.integer, unknown), from
 * lo to top (top compared unsigned), for PTX type `t` of `size` bytes: made once per entry. */
static void int_range(const char *t, Py_ssize_t size, long long *lo, unsigned long long *top) {
    int bits = (int)size * 8;
    int known = t[0] == 'b' || t[0] == 'u' || t[0] == 's' || strcmp(t, "unknown") == 0 || strcmp(t, "ptr") == 0;
    if (size > 8 || size < 1 || !known) { /* no integer fits */
        *lo = 1;
        *top = 0;
        return;
    }
    *lo = bits >= 64 ? LLONG_MIN : -(1LL << (bits - 1));
    *top = bits >= 64 ? ~0ULL : (1ULL << bits) - 1; /* untyped bits: either sign */
    if (strcmp(t, "unknown") == 0) return;
    if ((t[0] == 'u' || t[0] == 'p') && bits < 64)
        *lo = 0;
    else if (t[0] == 's')
        *top >>= 1;
}

static void free_strings(char **v, Py_ssize_t n) {
    if (v == NULL) return;
    for (Py_ssize_t i = 0; i < n; i++) PyMem_Free(v[i]);
    PyMem_Free(v);
}

static void free_facts(entry_facts *f) {
    Py_ssize_t n;
    if (f == NULL) return;
    n = f->n;
    PyMem_Free(f->label);
    PyMem_Free(f->signature);
    PyMem_Free(f->sticky_hint);
    free_strings(f->prefix, n);
    free_strings(f->type, n);
    free_strings(f->text, n);
    PyMem_Free(f->size);
    PyMem_Free(f->lo);
    PyMem_Free(f->top);
    PyMem_Free(f);
}

/* A copy of a str's UTF-8 (PyMem), or NULL with an error. */
static char *copy_str(PyObject *o) {
    Py_ssize_t len;
    const char *u = o != NULL && PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &len) : NULL;
    char *out;
    if (u == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "entry facts: a str was expected");
        return NULL;
    }
    if ((out = PyMem_Malloc(len + 1)) == NULL) return (char *)PyErr_NoMemory();
    memcpy(out, u, len + 1);
    return out;
}

/* Attribute `name` of `facts`, a str, copied. */
static char *facts_str(PyObject *facts, const char *name) {
    PyObject *v = spec_get(facts, name);
    char *out = v == NULL ? NULL : copy_str(v);
    Py_XDECREF(v);
    return out;
}

/* Attribute `name` of `facts`, a tuple of `n` strs, copied; NULL with an error. */
static char **facts_strs(PyObject *facts, const char *name, Py_ssize_t n) {
    PyObject *t = spec_get(facts, name);
    char **out = NULL;
    if (t == NULL) return NULL;
    if (!PyTuple_Check(t) || PyTuple_Size(t) != n) {
        PyErr_Format(PyExc_TypeError, "entry facts: %s must be a tuple of %zd strs", name, n);
    } else if ((out = PyMem_Calloc(n + 1, sizeof(char *))) == NULL) {
        PyErr_NoMemory();
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            if ((out[i] = copy_str(PyTuple_GetItem(t, i))) == NULL) {
                free_strings(out, n);
                out = NULL;
                break;
            }
    }
    Py_DECREF(t);
    return out;
}

/* Attribute `name` of `facts`: a tuple of up to `most` ints into out[] (the count), or -1. */
static int facts_ints(PyObject *facts, const char *name, long long *out, int most) {
    PyObject *t = spec_get(facts, name);
    int n = -1;
    if (t == NULL) return -1;
    if (!PyTuple_Check(t) || PyTuple_Size(t) > most) {
        PyErr_Format(PyExc_TypeError, "entry facts: %s must be a tuple of at most %d ints", name, most);
    } else {
        n = (int)PyTuple_Size(t);
        for (int i = 0; i < n; i++) {
            out[i] = PyLong_AsLongLong(PyTuple_GetItem(t, i));
            if (out[i] == -1 && PyErr_Occurred()) {
                n = -1;
                break;
            }
        }
    }
    Py_DECREF(t);
    return n;
}

/* entry (spec.entry): None, or the facts the C entry point's checks and messages need
 * (nbjit.launch.entry.EntryFacts). */
static int init_entry(Launcher *self, PyObject *spec) {
    PyObject *facts = spec_get(spec, "entry"), *sizes = NULL;
    entry_facts *f;
    long long v[16];
    int r = -1, k;
    if (facts == NULL) return -1;
    free_facts(self->facts);
    self->facts = NULL;
    if (facts == Py_None) {
        Py_DECREF(facts);
        return 0;
    }
    if ((f = PyMem_Calloc(1, sizeof(entry_facts))) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    self->facts = f;
    f->n = self->n;
    if (!(f->label = facts_str(facts, "label")) || !(f->signature = facts_str(facts, "signature")) ||
        !(f->sticky_hint = facts_str(facts, "sticky_hint")) || !(f->prefix = facts_strs(facts, "prefix", self->n)) ||
        !(f->type = facts_strs(facts, "types", self->n)) || !(f->text = facts_strs(facts, "texts", self->n)))
        goto out;
    if ((f->size = PyMem_Calloc(self->n + 1, sizeof(Py_ssize_t))) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    if ((sizes = spec_get(facts, "sizes")) == NULL) goto out;
    if (!PyTuple_Check(sizes) || PyTuple_Size(sizes) != self->n) {
        PyErr_SetString(PyExc_TypeError, "entry facts: sizes holds one int per parameter");
        goto out;
    }
    if ((f->lo = PyMem_Calloc(self->n + 1, sizeof(long long))) == NULL ||
        (f->top = PyMem_Calloc(self->n + 1, sizeof(unsigned long long))) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < self->n; i++) {
        f->size[i] = PyLong_AsSsize_t(PyTuple_GetItem(sizes, i));
        if (f->size[i] == -1 && PyErr_Occurred()) goto out;
        if (f->size[i] < 0 || self->offsets[i] + f->size[i] > self->size) {
            PyErr_SetString(PyExc_ValueError, "entry facts: a parameter's size runs past the buffer");
            goto out;
        }
        int_range(f->type[i], f->size[i], &f->lo[i], &f->top[i]);
    }
    if (facts_ints(facts, "limits", v, 4) != 4) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "entry facts: limits holds 4 ints");
        goto out;
    }
    f->ctx = (void *)(intptr_t)v[0];
    f->static_shared = v[1];
    f->max_optin = v[2];
    f->max_threads = v[3];
    if ((k = facts_ints(facts, "cluster", f->cluster, 3)) < 0) goto out;
    if (k != 0 && k != 3) {
        PyErr_SetString(PyExc_TypeError, "entry facts: cluster holds 3 ints or none");
        goto out;
    }
    if ((k = facts_ints(facts, "sticky", v, 16)) < 0) goto out;
    for (f->nsticky = 0; f->nsticky < k; f->nsticky++) f->sticky[f->nsticky] = (int)v[f->nsticky];
    r = 0;
out:
    Py_DECREF(facts);
    Py_XDECREF(sizes);
    if (r < 0) {
        free_facts(self->facts);
        self->facts = NULL;
    }
    return r;
}

/* The message (at most `size` bytes, NUL-terminated) and the status: 1 an argument error,
 * 2 a launch error. */
enum { ENTRY_OK, ENTRY_ARGUMENT, ENTRY_LAUNCH };

static int fail(char *msg, long long size, int status, const char *fmt, ...) {
    va_list ap;
    if (msg != NULL && size > 0) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)size, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* Python's repr() of a double: the shortest "%g" that reads back the same. */
static void float_repr(double v, char *out, size_t size) {
    for (int p = 1; p <= 17; p++) {
        snprintf(out, size, "%.*g", p, v);
        if (strtod(out, NULL) == v) break;
    }
    if (strspn(out, "-0123456789") == strlen(out)) strncat(out, ".0", size - strlen(out) - 1);
}

/* A tuple of n ints as Python prints it: (8,), (8, 16); `bare`: one int without parentheses. */
static void tuple_repr(const long long *v, int n, int bare, char *out, size_t size) {
    size_t at = 0;
    if (bare && n == 1) {
        snprintf(out, size, "%lld", v[0]);
        return;
    }
    at += snprintf(out + at, size - at, "(");
    for (int k = 0; k < n && at < size; k++)
        at += snprintf(out + at, size - at, k ? ", %lld" : "%lld", v[k]);
    if (at < size) snprintf(out + at, size - at, n == 1 ? ",)" : ")");
}

/* Why parameter `i` (PTX type `t`) refuses the int64 `n`, as the Python rules say it. */
static int int_refusal(entry_facts *F, Py_ssize_t i, long long n, char *msg, long long msize) {
    const char *t = F->type[i];
    int bytes = (int)F->size[i], bits = bytes * 8;
    if (bytes > 8 || F->lo[i] > 0) return fail(msg, msize, ENTRY_ARGUMENT, "%s: an integer cannot fill it", F->prefix[i]);
    if (t[0] == 'b') return fail(msg, msize, ENTRY_ARGUMENT, "%s: %lld does not fit in %d bits", F->prefix[i], n, bits);
    if (t[0] == 's')
        return fail(msg, msize, ENTRY_ARGUMENT, "%s: %lld does not fit in .%s (%lld to %lld)", F->prefix[i], n, t,
                    F->lo[i], (long long)F->top[i]);
    if (t[0] != 'u' || strcmp(t, "unknown") == 0)
        return fail(msg, msize, ENTRY_ARGUMENT, "%s: %lld does not fit in %d bytes", F->prefix[i], n, bytes);
    if (n < 0)
        return fail(msg, msize, ENTRY_ARGUMENT,
                    "%s: %lld is negative; the parameter is .%s (nvcc writes C 'int' as .u32: pass np.int%d(%lld) "
                    "to send a signed value's bits)", F->prefix[i], n, t, bits, n);
    return fail(msg, msize, ENTRY_ARGUMENT, "%s: %lld does not fit in .%s (at most %llu)", F->prefix[i], n, t,
                F->top[i]);
}

/* An int64 for parameter `i` into `dst` (its low bytes: little-endian), where its rule takes it. */
static int entry_int(entry_facts *F, Py_ssize_t i, long long n, unsigned char *dst, char *msg, long long msize) {
    if (n < F->lo[i] || (n > 0 && (unsigned long long)n > F->top[i])) return int_refusal(F, i, n, msg, msize);
    memcpy(dst, &n, (size_t)F->size[i]);
    return ENTRY_OK;
}

/* A view {data, ndim, extents, strides} for array parameter `i` into `dst`. */
static int entry_array(Launcher *self, Py_ssize_t i, const long long *view, unsigned char *dst, char *msg,
                       long long msize) {
    entry_facts *F = self->facts;
    int memref = self->codes[i] == 'M', nd = self->ndim[i];
    char s[400];
    if (view[1] != nd)
        return fail(msg, msize, ENTRY_ARGUMENT, "%s: a %lld-d array was passed; the parameter is %s", F->prefix[i],
                    view[1], F->text[i]);
    const long long *shape = view + 2, *strides = view + 2 + nd;
    switch (array_problem(self, i, shape, strides, memref)) {
    case ARRAY_NEGATIVE:
        tuple_repr(shape, nd, 0, s, sizeof s);
        return fail(msg, msize, ENTRY_ARGUMENT, "%s: its shape %s has a negative extent", F->prefix[i], s);
    case ARRAY_NOT_CONTIGUOUS:
        tuple_repr(strides, nd, 0, s, sizeof s);
        return fail(msg, msize, ENTRY_ARGUMENT,
                    "%s: the array is not %s-contiguous (strides %s); the parameter is %s: pass a contiguous copy, or "
                    "compile the kernel for layout 'A'", F->prefix[i], self->contig[i] == 'C' ? "C" : "Fortran", s,
                    F->text[i]);
    case ARRAY_STRIDES_NOT_ITEMS:
        tuple_repr(strides, nd, 0, s, sizeof s);
        return fail(msg, msize, ENTRY_ARGUMENT,
                    "%s: its strides %s are not whole multiples of its %d-byte items; the parameter is %s, which "
                    "numba-cuda-mlir's kernels take in items", F->prefix[i], s, self->itemsize[i], F->text[i]);
    }
    write_array(self, i, (unsigned long long)view[0], shape, strides, dst, memref);
    return ENTRY_OK;
}

/* Argument i (at `a`, in its class's form) into `dst` by parameter i's code. */
static int entry_one(Launcher *self, Py_ssize_t i, const void *a, unsigned char *dst, char *msg, long long msize) {
    entry_facts *F = self->facts;
    long long n;
    double x;
    char s[40];
    if (a == NULL) return fail(msg, msize, ENTRY_ARGUMENT, "%s: no value (its args[] entry is NULL)", F->prefix[i]);
    switch (self->codes[i]) {
    case 'P': case 'A': case 'q': case 'i': case 'h': case 'b': case 'I': case 'H': case 'B':
    case '1': case '2': case '4':
        memcpy(&n, a, 8);
        return entry_int(F, i, n, dst, msg, msize);
    case 'f': case 'd':
        memcpy(&x, a, 8);
        if (self->codes[i] == 'd') {
            memcpy(dst, &x, 8);
        } else if (!store_f32(x, dst)) {
            float_repr(x, s, sizeof s);
            return fail(msg, msize, ENTRY_ARGUMENT, "%s: %s overflows .%s", F->prefix[i], s, F->type[i]);
        }
        return ENTRY_OK;
    case 'N': case 'M':
        return entry_array(self, i, (const long long *)a, dst, msg, msize);
    case 'X':
        memcpy(dst, a, (size_t)F->size[i]);
        return ENTRY_OK;
    }
    return fail(msg, msize, ENTRY_ARGUMENT, "%s: no value can be passed for it", F->prefix[i]);
}

/* nbjit_pack(kernel, args, nargs, buf, message, size) -> status: the arguments packed into `buf`
 * (the kernel's parameter buffer, kernel.c_entry.param_size bytes) by the kernel's signature. */
static int nbjit_pack(const void *kernel, void *const *args, long long nargs, unsigned char *buf, char *msg,
                      long long msize) {
    Launcher *self = (Launcher *)kernel;
    entry_facts *F = self != NULL ? self->facts : NULL;
    if (F == NULL) return fail(msg, msize, ENTRY_LAUNCH, "nbjit: not a kernel's C entry (kernel.c_entry.kernel)");
    if (nargs != self->nargs)
        return fail(msg, msize, ENTRY_ARGUMENT, "kernel %s takes %zd argument%s, got %lld: %s", F->label, self->nargs,
                    self->nargs == 1 ? "" : "s", nargs, F->signature);
    if (self->size) memset(buf, 0, (size_t)self->size);
    for (Py_ssize_t i = 0; i < self->nargs; i++) {
        int r = entry_one(self, i, args[i], buf + self->offsets[i], msg, msize);
        if (r != ENTRY_OK) return r;
    }
    return ENTRY_OK;
}

/* A grid's or block's values checked as LaunchConfig.make checks them; their 32-bit values into
 * d[]. `form`, how the caller wrote them (for messages): 0 a tuple of 3, 1-3 a tuple of that
 * many, 4 one int. */
static int entry_dims(entry_facts *F, const char *what, const long long *v, int form, unsigned *d, char *msg,
                      long long msize) {
    char s[100];
    if (form > 4) form = 0; /* (not a form: three values) */
    for (int k = 0; k < 3; k++) {
        if (v[k] < 1 || v[k] >= (1LL << 32)) {
            tuple_repr(v, form == 4 ? 1 : form ? form : 3, form == 4, s, sizeof s);
            return fail(msg, msize, ENTRY_LAUNCH, "kernel %s: %s values must be from 1 to 2**32 - 1 (got %s)", F->label,
                        what, s);
        }
        d[k] = (unsigned)v[k];
    }
    return ENTRY_OK;
}

/* grid, block and dynamic shared memory (dims[7]) checked as Kernel.configure checks them. */
static int entry_config(Launcher *self, const long long *dims, int forms, unsigned *d, char *msg, long long msize) {
    entry_facts *F = self->facts;
    int r;
    if (dims[6] < 0)
        return fail(msg, msize, ENTRY_LAUNCH, "kernel %s: dynamic shared memory must be a byte count >= 0, got %lld",
                    F->label, dims[6]);
    if ((r = entry_dims(F, "grid", dims, forms & 7, d, msg, msize)) != ENTRY_OK ||
        (r = entry_dims(F, "block", dims + 3, (forms >> 3) & 7, d + 3, msg, msize)) != ENTRY_OK)
        return r;
    if (dims[6] > F->max_optin || F->static_shared + dims[6] > F->max_optin)
        return fail(msg, msize, ENTRY_LAUNCH,
                    "kernel %s: %lld bytes of dynamic shared memory plus %lld static exceed the %lld bytes a block can "
                    "have on this device", F->label, dims[6], F->static_shared, F->max_optin);
    d[6] = (unsigned)dims[6];
    if (F->cluster[0] && (d[0] % F->cluster[0] || d[1] % F->cluster[1] || d[2] % F->cluster[2]))
        return fail(msg, msize, ENTRY_LAUNCH, "kernel %s: grid (%u, %u, %u) is not a multiple of its cluster shape "
                    "(%lld, %lld, %lld)", F->label, d[0], d[1], d[2], F->cluster[0], F->cluster[1], F->cluster[2]);
    return ENTRY_OK;
}

/* A CUresult as driver.error_text words it (its sticky hint aside): "NAME (code): text". */
static void error_text(int err, char *out, size_t size) {
    const char *name = NULL, *text = NULL;
    if (p_error_name && p_error_string && p_error_name(err, &name) == 0 && p_error_string(err, &text) == 0 && name &&
        text)
        snprintf(out, size, "%s (%d): %s", name, err, text);
    else
        snprintf(out, size, "CUDA error %d", err);
}

/* What a failed launch's CUresult says, as driver.error_text and launchers._shape_problem say it. */
static int entry_launch_error(Launcher *self, int err, const unsigned *d, char *msg, long long msize) {
    entry_facts *F = self->facts;
    char why[600], shape[160] = "";
    int sticky = 0;
    unsigned long long threads = (unsigned long long)d[3] * d[4]; /* < 2**64 */
    int huge = d[5] && threads > ULLONG_MAX / d[5];                /* (a block no device runs) */
    threads = huge ? ULLONG_MAX : threads * d[5];
    error_text(err, why, sizeof why);
    for (int k = 0; k < F->nsticky; k++) sticky |= F->sticky[k] == err;
    if (err == 1 && threads > (unsigned long long)F->max_threads) {
        snprintf(shape, sizeof shape, ": a block of %s%llu threads, and this kernel runs at most %lld per block",
                 huge ? "more than " : "", threads, F->max_threads);
    } else if (err == 1) {
        static const char *axes[] = {"x", "y", "z"};
        static const long long block_limit[] = {1024, 1024, 64}, grid_limit[] = {2147483647LL, 65535, 65535};
        for (int k = 0; k < 3 && !shape[0]; k++)
            if (d[3 + k] > block_limit[k])
                snprintf(shape, sizeof shape, ": block %s is %u, and CUDA allows at most %lld", axes[k], d[3 + k],
                         block_limit[k]);
        for (int k = 0; k < 3 && !shape[0]; k++)
            if (d[k] > grid_limit[k])
                snprintf(shape, sizeof shape, ": grid %s is %u, and CUDA allows at most %lld", axes[k], d[k],
                         grid_limit[k]);
    }
    return fail(msg, msize, ENTRY_LAUNCH,
                "launch of kernel %s failed (grid (%u, %u, %u), block (%u, %u, %u), %u bytes dynamic shared memory): "
                "%s%s%s%s%s", F->label, d[0], d[1], d[2], d[3], d[4], d[5], d[6], why, sticky ? " (" : "",
                sticky ? F->sticky_hint : "", sticky ? ")" : "", shape);
}

/* The kernel launched with the checked configuration d[7] on `stream`, its parameters packed in
 * `buf` (nbjit_pack's); in a thread with no current context, the kernel's made current. */
static int entry_launch_packed(Launcher *self, const unsigned *d, void *stream, unsigned char *buf, char *msg,
                               long long msize) {
    void *stack_ptrs[STACK_PARAMS], **ptrs = stack_ptrs;
    if (p_launch == NULL || (self->nattrs && p_launch_ex == NULL))
        return fail(msg, msize, ENTRY_LAUNCH, "nbjit: the driver's launch entry points are not set (kernel.c_entry "
                    "sets them)");
    if (self->nparams > STACK_PARAMS && (ptrs = malloc(sizeof(void *) * (size_t)self->nparams)) == NULL)
        return fail(msg, msize, ENTRY_LAUNCH, "nbjit: out of memory for kernel %s's parameters", self->facts->label);
    point_into(self, buf, ptrs);
    int err = launch_raw(self->func, d, stream, self->nparams ? ptrs : NULL, self->attrs, self->nattrs);
    if (err == 201 /* CUDA_ERROR_INVALID_CONTEXT */ && p_ctx_current && p_ctx_set) {
        void *cur = NULL;
        if (p_ctx_current(&cur) == 0 && cur == NULL && p_ctx_set(self->facts->ctx) == 0)
            err = launch_raw(self->func, d, stream, self->nparams ? ptrs : NULL, self->attrs, self->nattrs);
    }
    if (ptrs != stack_ptrs) free(ptrs);
    return err ? entry_launch_error(self, err, d, msg, msize) : ENTRY_OK;
}

/* nbjit_launch(kernel, dims, forms, stream, args, nargs, message, size) -> status: the kernel
 * launched with grid dims[0:3], block dims[3:6] and dims[6] bytes of dynamic shared memory on
 * `stream`, its arguments packed by nbjit_pack; `forms`: how the caller wrote the grid (bits 0-2)
 * and the block (bits 3-5), for messages: 0 a tuple of 3, 1-3 a tuple of that many, 4 one int.
 * No Python, no GIL: any thread. In a thread with no current context, the kernel's is made
 * current (as a Python launch does). */
static int nbjit_launch(const void *kernel, const long long *dims, int forms, void *stream, void *const *args,
                        long long nargs, char *msg, long long msize) {
    Launcher *self = (Launcher *)kernel;
    unsigned char stack_buf[STACK_BYTES], *buf = stack_buf;
    unsigned d[7];
    int r;
    if (self == NULL || self->facts == NULL)
        return fail(msg, msize, ENTRY_LAUNCH, "nbjit: not a kernel's C entry (kernel.c_entry.kernel)");
    if ((r = entry_config(self, dims, forms, d, msg, msize)) != ENTRY_OK) return r;
    if (self->size > STACK_BYTES && (buf = malloc((size_t)self->size)) == NULL)
        return fail(msg, msize, ENTRY_LAUNCH, "nbjit: out of memory for kernel %s's parameters", self->facts->label);
    if ((r = nbjit_pack(kernel, args, nargs, buf, msg, msize)) == ENTRY_OK)
        r = entry_launch_packed(self, d, stream, buf, msg, msize);
    if (buf != stack_buf) free(buf);
    return r;
}

/* nbjit_synchronize(stream, message, size) -> status: cuStreamSynchronize, its error as a message. */
static int nbjit_synchronize(void *stream, char *msg, long long msize) {
    char why[600];
    int err;
    if (p_stream_sync == NULL)
        return fail(msg, msize, ENTRY_LAUNCH, "nbjit: the driver's cuStreamSynchronize entry point is not set");
    err = p_stream_sync(stream);
    if (err == 0) return ENTRY_OK;
    error_text(err, why, sizeof why);
    return fail(msg, msize, ENTRY_LAUNCH, "synchronizing stream 0x%llx failed: %s", (unsigned long long)(uintptr_t)stream,
                why);
}

/* entry_points() -> {"launch": address, "pack": address, "synchronize": address}: the C entry
 * point's functions, for compiled callers (@njit code, ctypes, cffi, C). */
static PyObject *entry_points(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:N,s:N,s:N}", "launch", PyLong_FromVoidPtr((void *)(uintptr_t)&nbjit_launch), "pack",
                         PyLong_FromVoidPtr((void *)(uintptr_t)&nbjit_pack), "synchronize",
                         PyLong_FromVoidPtr((void *)(uintptr_t)&nbjit_synchronize));
}

/* ------------------------------------------------------------------ XLA's FFI (nbjit.jax.call)
 *
 * One handler for every kernel that JAX calls through its FFI (jax.ffi.ffi_call("nbjit_launch")):
 * the kernel, its launch shape and where each of its arguments comes from travel as the call's
 * attributes, so no kernel needs a C++ build of its own. The structs below are those of XLA's
 * FFI C API (xla/ffi/api/c_api.h, API version 0.x) that the handler reads, by their documented
 * layout; each starts with its own size, as that API's structs do.
 *
 * Attributes (nbjit/frameworks/jax.py writes them):
 *   kernel  u64 scalar: a kernel's C entry (CEntry.kernel; kept alive by jax.py)
 *   dims    s64[7]: grid x, y, z, block x, y, z, dynamic shared memory bytes
 *   plan    s64[2 * parameters]: per parameter, where its argument is: (0, i) the call's i-th
 *           input buffer, (1, i) its i-th result buffer, (2, i) ints[i], (3, i) floats[i]
 *   ints    s64[], floats f64[]: the scalar arguments */

typedef struct xla_ext { size_t struct_size; int type; struct xla_ext *next; } xla_ext;
typedef struct { size_t struct_size; xla_ext *ext; int major, minor; } xla_version;
typedef struct { size_t struct_size; xla_ext *ext; const char *message; int errc; } xla_error_args;
typedef struct { size_t struct_size; xla_ext *ext; void *ctx; void *stream; } xla_stream_args;
typedef struct { size_t struct_size; xla_ext *ext; int dtype; void *data; int64_t rank; int64_t *dims; } xla_buffer;
typedef struct { size_t struct_size; xla_ext *ext; int64_t size; int *types; void **items; } xla_list;
typedef struct { const char *ptr; size_t len; } xla_span;
typedef struct { size_t struct_size; xla_ext *ext; int64_t size; int *types; xla_span **names; void **attrs; } xla_attrs;
typedef struct { int dtype; void *value; } xla_scalar;
typedef struct { int dtype; size_t size; void *data; } xla_array;
typedef void *(*xla_fn)(void *);
typedef struct {
    size_t struct_size;
    xla_ext *ext;
    xla_version api_version;
    const void *internal_api;
    xla_fn error_create, error_get_message, error_destroy, handler_register, stream_get;
} xla_api; /* (its first functions: those the handler calls) */
typedef struct {
    size_t struct_size;
    xla_ext *ext;
    const xla_api *api;
    void *ctx;
    int stage;
    xla_list args, rets;
    xla_attrs attrs;
    void *future;
} xla_frame;
typedef struct { size_t struct_size; xla_version api_version; uint32_t traits; int64_t state_type_id; } xla_metadata;
typedef struct { xla_ext base; xla_metadata *metadata; } xla_metadata_ext;

enum { XLA_EXT_METADATA = 1, XLA_STAGE_EXECUTE = 3, XLA_ATTR_ARRAY = 1, XLA_ATTR_SCALAR = 3, XLA_S64 = 5,
       XLA_U64 = 9, XLA_F64 = 12, XLA_INVALID_ARGUMENT = 3, XLA_INTERNAL = 13, XLA_COMMAND_BUFFER = 1 };

static void *xla_error(const xla_frame *frame, int errc, const char *message) {
    xla_error_args a = {sizeof(xla_error_args), NULL, message, errc};
    return frame->api->error_create(&a);
}

/* Attribute `name` of `type` (and, for arrays, of element `dtype`), or NULL. */
static void *xla_attr(const xla_frame *frame, const char *name, int type, int dtype) {
    const xla_attrs *A = &frame->attrs;
    size_t n = strlen(name);
    for (int64_t k = 0; k < A->size; k++) {
        const xla_span *s = A->names[k];
        if (s->len != n || memcmp(s->ptr, name, n) != 0 || A->types[k] != type) continue;
        if (type == XLA_ATTR_ARRAY && ((xla_array *)A->attrs[k])->dtype != dtype) return NULL;
        if (type == XLA_ATTR_SCALAR && ((xla_scalar *)A->attrs[k])->dtype != dtype) return NULL;
        return A->attrs[k];
    }
    return NULL;
}

/* Where parameter i's argument is (plan entry `where`, `index`) into args[i] (views into `space`);
 * an error message, or NULL. */
static const char *xla_argument(const xla_frame *frame, Launcher *self, Py_ssize_t i, const long long *plan,
                                const xla_array *ints, const xla_array *floats, void **args, long long *space) {
    long long where = plan[2 * i], index = plan[2 * i + 1];
    char code = self->codes[i];
    int buffer = code == 'P' || code == 'A' || code == 'N' || code == 'M', real = code == 'f' || code == 'd';
    if (((where == 0 || where == 1) && !buffer) || (where == 2 && (real || code == 'N' || code == 'M' ||
                                                                   code == 'X')) || (where == 3 && !real))
        return "nbjit.jax.call: a plan entry's source does not fit its parameter (the call was not made by "
               "nbjit.jax.call for this kernel)";
    const xla_list *list = where == 0 ? &frame->args : where == 1 ? &frame->rets : NULL;
    if (list != NULL) {
        if (index < 0 || index >= list->size) return "nbjit.jax.call: a plan entry names a buffer the call lacks";
        const xla_buffer *b = list->items[index];
        space[0] = (long long)(uintptr_t)b->data;
        if (self->codes[i] == 'N' || self->codes[i] == 'M') { /* a @cuda.jit array: a C-contiguous view */
            long long step = self->itemsize[i];
            space[1] = b->rank;
            for (int64_t k = b->rank - 1; k >= 0; k--) {
                space[2 + k] = b->dims[k];
                space[2 + b->rank + k] = step;
                step *= b->dims[k];
            }
        }
    } else if (where == 2 || where == 3) {
        const xla_array *from = where == 2 ? ints : floats;
        if (from == NULL || index < 0 || (size_t)index >= from->size)
            return "nbjit.jax.call: a plan entry names a scalar the call lacks";
        memcpy(space, (const char *)from->data + 8 * index, 8);
    } else {
        return "nbjit.jax.call: a plan entry of no known source";
    }
    args[i] = space;
    return NULL;
}

/* The highest rank of a list's buffers (an array parameter's view: 2 + 2 * rank values). */
static size_t xla_rank(const xla_list *list) {
    size_t rank = 0;
    for (int64_t k = 0; k < list->size; k++)
        if ((size_t)((xla_buffer *)list->items[k])->rank > rank) rank = (size_t)((xla_buffer *)list->items[k])->rank;
    return rank;
}

/* The kernel's arguments decoded from the call (by `plan`), checked and packed into `buf`
 * (nbjit_pack), the configuration into d[7]: a status, its message in `msg`. */
static int xla_pack(const xla_frame *frame, Launcher *self, const xla_array *dims, const xla_array *plan,
                    unsigned *d, unsigned char *buf, char *msg, long long msize) {
    const xla_array *ints = xla_attr(frame, "ints", XLA_ATTR_ARRAY, XLA_S64);
    const xla_array *floats = xla_attr(frame, "floats", XLA_ATTR_ARRAY, XLA_F64);
    long long stack_space[STACK_PARAMS], *space = stack_space;
    void *stack_args[STACK_PARAMS], **args = stack_args;
    size_t need = 0, rank = xla_rank(&frame->args) > xla_rank(&frame->rets) ? xla_rank(&frame->args)
                                                                            : xla_rank(&frame->rets);
    for (Py_ssize_t i = 0; i < self->nargs; i++) need += (self->codes[i] == 'N' || self->codes[i] == 'M') ? 2 + 2 * rank : 1;
    if ((need > STACK_PARAMS && (space = malloc(need * sizeof(long long))) == NULL) ||
        (self->nargs > STACK_PARAMS && (args = malloc(sizeof(void *) * (size_t)self->nargs)) == NULL)) {
        if (space != stack_space) free(space);
        return fail(msg, msize, ENTRY_LAUNCH, "nbjit.jax.call: out of memory for the kernel's arguments");
    }
    const char *problem = NULL;
    long long *at = space;
    for (Py_ssize_t i = 0; i < self->nargs && problem == NULL; i++) {
        problem = xla_argument(frame, self, i, (const long long *)plan->data, ints, floats, args, at);
        at += (self->codes[i] == 'N' || self->codes[i] == 'M') ? 2 + 2 * at[1] : 1;
    }
    int r = problem ? fail(msg, msize, ENTRY_ARGUMENT, "%s", problem)
                    : entry_config(self, (const long long *)dims->data, 0, d, msg, msize);
    if (r == ENTRY_OK) r = nbjit_pack(self, args, self->nargs, buf, msg, msize);
    if (space != stack_space) free(space);
    if (args != stack_args) free(args);
    return r;
}

/* The handler: XLA's FFI calls it to learn its metadata, then once per execution: the
 * arguments packed and checked, then the kernel launched on XLA's stream. */
static void *nbjit_xla_launch(xla_frame *frame) {
    if (frame->ext != NULL && frame->ext->type == XLA_EXT_METADATA) {
        xla_metadata *m = ((xla_metadata_ext *)frame->ext)->metadata;
        m->api_version.major = 0;
        m->api_version.minor = 1;
        m->traits = XLA_COMMAND_BUFFER; /* it launches on the given stream alone: capturable */
        return NULL;
    }
    if (frame->stage != XLA_STAGE_EXECUTE) return NULL;
    const xla_scalar *kernel = xla_attr(frame, "kernel", XLA_ATTR_SCALAR, XLA_U64);
    const xla_array *dims = xla_attr(frame, "dims", XLA_ATTR_ARRAY, XLA_S64);
    const xla_array *plan = xla_attr(frame, "plan", XLA_ATTR_ARRAY, XLA_S64);
    if (kernel == NULL || dims == NULL || dims->size != 7 || plan == NULL)
        return xla_error(frame, XLA_INVALID_ARGUMENT, "nbjit.jax.call: the call's attributes are not nbjit's "
                         "(kernel, dims[7], plan)");
    Launcher *self = (Launcher *)(uintptr_t)*(const uint64_t *)kernel->value;
    if (self == NULL || self->facts == NULL || plan->size != 2 * (size_t)self->nargs)
        return xla_error(frame, XLA_INVALID_ARGUMENT, "nbjit.jax.call: the plan does not fit the kernel");
    unsigned char stack_buf[STACK_BYTES], *buf = stack_buf;
    unsigned d[7];
    char msg[1024];
    if (self->size > STACK_BYTES && (buf = malloc((size_t)self->size)) == NULL)
        return xla_error(frame, XLA_INTERNAL, "nbjit.jax.call: out of memory for the kernel's parameters");
    int r = xla_pack(frame, self, dims, plan, d, buf, msg, sizeof msg);
    void *err = NULL;
    if (r == ENTRY_OK) {
        xla_stream_args st = {sizeof(xla_stream_args), NULL, frame->ctx, NULL};
        err = frame->api->stream_get(&st);
        if (err == NULL) r = entry_launch_packed(self, d, st.stream, buf, msg, sizeof msg);
    }
    if (buf != stack_buf) free(buf);
    if (err != NULL || r == ENTRY_OK) return err;
    return xla_error(frame, r == ENTRY_ARGUMENT ? XLA_INVALID_ARGUMENT : XLA_INTERNAL, msg);
}

/* xla_handler() -> a PyCapsule of the handler, as jax.ffi.register_ffi_target takes it. */
static PyObject *xla_handler(PyObject *self, PyObject *unused) {
    return PyCapsule_New((void *)(uintptr_t)&nbjit_xla_launch, NULL, NULL);
}

static PyMethodDef launcher_methods[] = {
    {"pack_fast", launcher_pack, METH_O, "pack_fast(args) -> bytes or None (the C rules alone)"},
    {"set_node", (PyCFunction)(void (*)(void))launcher_set_node, METH_FASTCALL,
     "set_node(graph_exec, node, args, buf, buf_size) -> CUresult: a graph's kernel node given these arguments"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef launcher_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(Launcher, dict), READONLY, NULL},
    {"fallbacks", T_PYSSIZET, offsetof(Launcher, fallbacks), 0,
     "how many calls the C rules handed to the Python rules (writable, e.g. to reset it)"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot launcher_slots[] = {
    {Py_tp_dealloc, launcher_dealloc},
    {Py_tp_traverse, launcher_traverse},
    {Py_tp_clear, launcher_clear},
    {Py_tp_init, launcher_init},
    {Py_tp_call, launcher_call},
    {Py_tp_methods, launcher_methods},
    {Py_tp_members, launcher_members},
    {Py_tp_doc, "A kernel with its launch configuration; call it with the kernel's arguments."},
    {0, NULL},
};

static PyType_Spec launcher_spec = {
    "nbjit.gpu._launcher.Launcher", sizeof(Launcher), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, launcher_slots,
};

/* ------------------------------------------------------------------ KernelBase
 * kernel[config] in C: a look-up in the dict `_configs` (set by the subclass), and on a miss
 * (or an unhashable config) a call of the subclass's `_configure_cached(config)`. */

typedef struct {
    PyObject_HEAD
    PyObject *configs;
} KernelBase;

static PyObject *str_configure = NULL;

/* Whether a value in a config key is a float, bool or complex: equal to an int (4.0 == 4,
 * True == 1) and hashed as it is, so it would find that int's cached configuration, where
 * configuring it afresh refuses it. */
static int not_an_int(PyObject *v) {
    return PyFloat_Check(v) || PyBool_Check(v) || PyComplex_Check(v);
}

static int inexact_key(PyObject *key) {
    if (!PyTuple_Check(key)) return not_an_int(key);
    Py_ssize_t n = PyTuple_Size(key);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GetItem(key, i); /* borrowed */
        if (not_an_int(v)) return 1;
        if (PyTuple_Check(v)) {
            Py_ssize_t m = PyTuple_Size(v);
            for (Py_ssize_t j = 0; j < m; j++)
                if (not_an_int(PyTuple_GetItem(v, j))) return 1;
        }
    }
    return 0;
}

static PyObject *kernelbase_subscript(PyObject *op, PyObject *key) {
    KernelBase *self = (KernelBase *)op;
    if (self->configs != NULL && PyDict_Check(self->configs)) {
        PyObject *hit = PyDict_GetItemWithError(self->configs, key); /* borrowed */
        if (hit != NULL && !inexact_key(key)) {
            Py_INCREF(hit);
            return hit;
        }
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear(); /* unhashable: configure without caching */
        }
    }
    return PyObject_CallMethodObjArgs(op, str_configure, key, NULL);
}

static int kernelbase_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(((KernelBase *)op)->configs);
    Py_VISIT(Py_TYPE(op));
    return 0;
}

static int kernelbase_clear(PyObject *op) {
    Py_CLEAR(((KernelBase *)op)->configs);
    return 0;
}

static void kernelbase_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    kernelbase_clear(op);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(op);
    Py_DECREF(tp);
}

static PyMemberDef kernelbase_members[] = {
    {"_configs", T_OBJECT, offsetof(KernelBase, configs), 0, "configured launchers by [grid, block, ...]"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot kernelbase_slots[] = {
    {Py_tp_dealloc, kernelbase_dealloc},
    {Py_tp_traverse, kernelbase_traverse},
    {Py_tp_clear, kernelbase_clear},
    {Py_mp_subscript, kernelbase_subscript},
    {Py_tp_members, kernelbase_members},
    {Py_tp_doc, "kernel[grid, block, stream, shared] looked up in C."},
    {0, NULL},
};

static PyType_Spec kernelbase_spec = {
    "nbjit.gpu._launcher.KernelBase", sizeof(KernelBase), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, kernelbase_slots,
};

static PyMethodDef methods[] = {
    {"set_entry_point", set_entry_point, METH_VARARGS,
     "set_entry_point(name, address): cuLaunchKernel, cuLaunchKernelEx or cuCtxGetCurrent"},
    {"current_context", current_context, METH_NOARGS,
     "current_context() -> the current context's handle (0: none), or None on another driver error"},
    {"set_kernel_node", (PyCFunction)(void (*)(void))set_kernel_node, METH_FASTCALL,
     "set_kernel_node(graph_exec, node, func, gx, gy, gz, bx, by, bz, shared, params) -> CUresult"},
    {"set_node_enabled", (PyCFunction)(void (*)(void))set_node_enabled, METH_FASTCALL,
     "set_node_enabled(graph_exec, node, on) -> CUresult"},
    {"xla_handler", xla_handler, METH_NOARGS,
     "xla_handler() -> PyCapsule: the XLA FFI handler of nbjit.jax.call, for jax.ffi.register_ffi_target"},
    {"entry_points", entry_points, METH_NOARGS,
     "entry_points() -> {'launch', 'pack', 'synchronize': address}: the C entry point's functions"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(func, gx, gy, gz, bx, by, bz, shared, stream, params[, attributes]) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launcher", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launcher(void) {
    PyObject *m = PyModule_Create(&module), *t;
    if (m == NULL) return NULL;
    if ((str_dtype == NULL && (str_dtype = PyUnicode_InternFromString("dtype")) == NULL) ||
        (str_shape == NULL && (str_shape = PyUnicode_InternFromString("shape")) == NULL) ||
        (str_strides == NULL && (str_strides = PyUnicode_InternFromString("strides")) == NULL) ||
        (str_stride == NULL && (str_stride = PyUnicode_InternFromString("stride")) == NULL) ||
        (str_configure == NULL && (str_configure = PyUnicode_InternFromString("_configure_cached")) == NULL)) {
        Py_DECREF(m);
        return NULL;
    }
    t = PyType_FromSpec(&kernelbase_spec);
    if (t == NULL || PyModule_AddObject(m, "KernelBase", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    t = PyType_FromSpec(&launcher_spec);
    if (t == NULL || PyModule_AddObject(m, "Launcher", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
