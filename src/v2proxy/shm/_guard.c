/* v2proxy.shm._guard: memcpy that survives a SIGBUS.
 *
 * A client's shared-memory object can be truncated while v2proxy has it mapped; touching a page
 * past the object's new end then raises SIGBUS, which kills a Python process. copy() runs
 * memcpy with a per-thread recovery point (sigsetjmp) and a SIGBUS handler that jumps back to
 * it, so the fault becomes a return value. Faults anywhere else are handed to whatever handler
 * was installed before (faulthandler, or the default action: the process dies as it would
 * have), so genuine bugs are not hidden.
 *
 * Only sigaction and the signal mask are used: no extra capability, nothing a container
 * runtime's default seccomp profile refuses. See v2proxy/shm/guarded.py for the Python side.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <signal.h>
#include <string.h>

/* the recovery point of the copy in progress on this thread, NULL outside copy(); volatile, or
 * the compiler, which knows memcpy does not read it, drops the store before the copy */
static __thread sigjmp_buf *volatile recovery = NULL;
/* the SIGBUS disposition before ours: faults outside copy() go there */
static struct sigaction previous;
static int installed = 0;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    sigjmp_buf *env = recovery;
    if (env != NULL) {
        recovery = NULL;
        siglongjmp(*env, 1);
    }
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction != NULL) {
            previous.sa_sigaction(sig, info, context);
            return;
        }
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    /* the default action: restore it; returning re-executes the access, which faults again */
    sigaction(SIGBUS, &previous, NULL);
}

/* Make sure the handler is ours (something may have replaced it since, e.g. faulthandler
 * enabled later): then the one found there becomes the one faults elsewhere go to. */
static int ensure_installed(void)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) {
        return -1;
    }
    if (installed && (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) {
        return 0;
    }
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGBUS, &ours, &previous) != 0) {
        return -1;
    }
    installed = 1;
    return 0;
}

/* Below this many bytes the GIL is kept (releasing it costs more than the copy). */
#define RELEASE_GIL_FROM (1 << 16)

/* memcpy with this thread's recovery point set: 1 when it faulted, else 0. Not inlined, so that
 * the jump lands in a frame that is still there. */
static __attribute__((noinline)) int guarded_memcpy(char *to, const char *from, size_t n)
{
    sigjmp_buf env;
    if (sigsetjmp(env, 1) != 0) {
        return 1;
    }
    recovery = &env;
    memcpy(to, from, n);
    recovery = NULL;
    return 0;
}

static PyObject *guard_copy(PyObject *self, PyObject *args)
{
    Py_buffer dst, src;
    Py_ssize_t dst_offset = 0;
    if (!PyArg_ParseTuple(args, "w*y*|n:copy", &dst, &src, &dst_offset)) {
        return NULL;
    }
    if (dst_offset < 0 || src.len > dst.len - dst_offset) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, "copy: the source does not fit the destination");
        return NULL;
    }
    if (ensure_installed() != 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    char *to = (char *)dst.buf + dst_offset;
    const char *from = (const char *)src.buf;
    size_t n = (size_t)src.len;
    int faulted = 0;
    if (n >= RELEASE_GIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        faulted = guarded_memcpy(to, from, n);
        Py_END_ALLOW_THREADS
    } else if (n > 0) {
        faulted = guarded_memcpy(to, from, n);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return PyBool_FromLong(!faulted);
}

static PyMethodDef methods[] = {
    {"copy", guard_copy, METH_VARARGS,
     "copy(dst, src, dst_offset=0) -> bool\n\n"
     "Copy the bytes of src into dst at dst_offset; False when a page of either faulted\n"
     "(SIGBUS: a shared-memory object truncated under its mapping), True otherwise."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_guard", "memcpy that reports a SIGBUS instead of dying of it.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__guard(void)
{
    return PyModule_Create(&module);
}
