/* addtype.h - a type added to the module, as every native file's *_add does. */
#ifndef MPIMESH_ADDTYPE_H
#define MPIMESH_ADDTYPE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Ready `type` and add it to `module` as `name`; 0, or -1 with an exception set. */
static inline int mpimesh_add_type(PyObject *module, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

#endif /* MPIMESH_ADDTYPE_H */
