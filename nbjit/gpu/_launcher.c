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

/* set_entry_point(name, address): the driver function nbjit calls for `name`
 * ("cuLaunchKernel", "cuLaunchKernelEx", "cuCtxGetCurrent", "cuGraphExecKernelNodeSetParams" or
 * "cuGraphNodeSetEnabled"), as cuGetProcAddress gave it. */
static PyObject *set_entry_point(PyObject *self, PyObject *args) {
    const char *name;
    PyObject *addr;
    void *p;
    if (!PyArg_ParseTuple(args, "sO", &name, &addr)) return NULL;
    p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred()) return NULL;
    if (strcmp(name, "cuLaunchKernel") == 0)
        p_launch = (launch_fn)p;
    else if (strcmp(name, "cuLaunchKernelEx") == 0)
        p_launch_ex = (launch_ex_fn)p;
    else if (strcmp(name, "cuCtxGetCurrent") == 0)
        p_ctx_current = (ctx_fn)p;
    else if (strcmp(name, "cuGraphExecKernelNodeSetParams") == 0)
        p_node_set = (node_set_fn)p;
    else if (strcmp(name, "cuGraphNodeSetEnabled") == 0)
        p_node_enable = (node_enable_fn)p;
    else {
        PyErr_Format(PyExc_ValueError, "no entry point called %s", name);
        return NULL;
    }
    Py_RETURN_NONE;
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

/* cuLaunchKernel, or cuLaunchKernelEx where there are attributes; the GIL released. */
static int launch_any(void *f, const unsigned *d, void *stream, void **params, unsigned long long *attrs,
                      int nattrs) {
    int r;
    if (nattrs == 0) {
        Py_BEGIN_ALLOW_THREADS
        r = p_launch(f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, params, NULL);
        Py_END_ALLOW_THREADS
    } else {
        launch_config c = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, attrs, (unsigned)nattrs};
        Py_BEGIN_ALLOW_THREADS
        r = p_launch_ex(&c, f, params, NULL);
        Py_END_ALLOW_THREADS
    }
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
} Launcher;

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
        init_callbacks(self, spec) < 0 || init_attrs(self, spec) < 0)
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

/* A Numba array argument: meminfo 0, parent 0, nitems, itemsize, data, shape, strides; or,
 * `memref` set (numba-cuda-mlir), data, data, offset 0, shape, strides in items. */
static int pack_numba_array(Launcher *self, Py_ssize_t idx, PyObject *o, unsigned char *dst, int memref) {
    int nd = self->ndim[idx], ok = 1, k, in_items = 0;
    long long shape[32], strides[32], f[5];
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
    if (self->contig[idx] != 'A' && !contiguous(shape, strides, nd, self->itemsize[idx], self->contig[idx]))
        return 0; /* the Python rules say what is wrong */
    if (memref) {
        for (k = 0; k < nd; k++) {
            if (shape[k] < 0 || strides[k] % self->itemsize[idx]) return 0;
            strides[k] /= self->itemsize[idx];
        }
        f[2] = 0;
        memcpy(&f[0], &data, 8);
        memcpy(&f[1], &data, 8);
        memcpy(dst, f, 24);
        memcpy(dst + 24, shape, 8 * (size_t)nd);
        memcpy(dst + 24 + 8 * (size_t)nd, strides, 8 * (size_t)nd);
        return 1;
    }
    f[0] = 0;
    f[1] = 0;
    f[2] = 1;
    for (k = 0; k < nd; k++) {
        if (shape[k] < 0) return 0;
        f[2] *= shape[k];
    }
    f[3] = self->itemsize[idx];
    memcpy(&f[4], &data, 8);
    memcpy(dst, f, 40);
    memcpy(dst + 40, shape, 8 * (size_t)nd);
    memcpy(dst + 40 + 8 * (size_t)nd, strides, 8 * (size_t)nd);
    return 1;
}

/* A double into 4 bytes as a float; 0 where it does not fit (the precise rules say so). */
static int store_f32(double v, unsigned char *dst) {
    float x;
    if (isfinite(v) && fabs(v) > FLT_MAX) return 0;
    x = (float)v;
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

/* Codes 'q' 'i' 'h' 'b' (signed) and 'I' 'H' 'B' (unsigned): an int-like object in range. */
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
