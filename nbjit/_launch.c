/* nbjit._launch: cuLaunchKernel for the launch hot path, without the per-call argument
 * objects that a general binding builds. Optional: nbjit falls back to cuda.bindings when
 * this extension is not built. It never loads libcuda itself: Python hands it the entry
 * point that cuda.bindings' cuGetProcAddress found. Limited API (abi3), Python >= 3.10. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shmem, void *stream, void **params, void **extra);

static launch_fn p_launch = NULL;

static PyObject *set_entry_point(PyObject *self, PyObject *arg) {
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL && PyErr_Occurred()) return NULL;
    p_launch = (launch_fn)p;
    Py_RETURN_NONE;
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

/* launch(func, gx, gy, gz, bx, by, bz, shared, stream, params) -> CUresult as int.
 * func, stream and params are addresses (ints); params points to a void*[]. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned d[7];
    void *f, *stream, *params;
    int i, r;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "launch takes 10 arguments");
        return NULL;
    }
    if (p_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nbjit._launch: no entry point set");
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
    Py_BEGIN_ALLOW_THREADS
    r = p_launch(f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, (void **)params, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

static PyMethodDef methods[] = {
    {"set_entry_point", set_entry_point, METH_O, "Set the address of cuLaunchKernel."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(func, gx, gy, gz, bx, by, bz, shared, stream, params) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
