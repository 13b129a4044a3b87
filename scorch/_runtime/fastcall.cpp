// The warm-call path in C: one call checks the operands against what a kernel reads,
// allocates the output and runs the kernel's C entry (``kernel_c`` in the generated module);
// a pattern output's values are then handed to the plan's ``finish`` (a Storage on the
// pattern operand's levels).
//
// Why: a warm SpMV on a small matrix spends as long in Python (reading sizes, strides and
// addresses through torch's Python API, torch.empty) as in the kernel. Here each of those
// is a field read on the at::Tensor. The plan (``Plan``) is built once per compiled kernel
// by ``scorch.tensor_compiler.runner`` from the same description the Python runner is
// generated from; anything the plan does not cover exactly (a broadcast, another dtype, a
// strided operand to re-lay out, a large output) goes to that Python runner, which handles
// or reports it. Built against torch's headers by ``scorch.tensor_compiler.fastcall``.
#include <Python.h>
#include <structmember.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <array>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace {

typedef void (*KernelFn)(const int64_t* args, int nthreads, int panel);

constexpr const char* kCapsule = "scorch.kernel_c";
constexpr int kMaxVars = 32;
constexpr int kMaxOps = 16;
constexpr int kMaxArgs = 128;

enum OperandKind { kUnused = 0, kSparse = 1, kDense = 2 };
// what each kernel argument is (the codegen's argument table, see codegen.ArgSpec)
enum ArgKind {
  kSize = 0,       // a: index variable
  kStorage = 1,    // a: operand, b: index into its storage_pointers tuple (< 0: from the end)
  kData = 2,       // a: operand (a dense tensor's data_ptr)
  kStride = 3,     // a: operand, b: bit mask of its dimensions (their strides are summed)
  kOut = 4,        // the output's data_ptr
  kOutStride = 5,  // b: bit mask of index variables (product of their sizes)
};

struct Operand {
  int kind;
  int64_t sig;            // sparse: storage_signature
  at::ScalarType dtype;   // dense
  int ndim;               // dense
};
struct Dim { int op, dim, var; };
struct Arg { int kind, a; int64_t b; };

struct Spec {
  KernelFn kernel = nullptr;
  KernelFn short_kernel = nullptr;   // scalar variant for short rows (may be absent)
  std::vector<Operand> ops;
  std::vector<Dim> dims;             // the first occurrence of a variable defines its size
  int nvars = 0;
  std::vector<std::pair<int, int>> unit;   // (op, dim) read with stride 1
  std::vector<std::array<int, 3>> order;   // (op, u, w): dim w not nested outside dim u
  std::vector<Arg> args;
  int64_t min_work = 0;
  at::ScalarType out_dtype = at::kFloat;
  std::vector<int> out_vars;
  int64_t out_max = 0;               // larger outputs: the Python runner (numpy, huge pages)
  int short_op = -1;
  std::vector<int> short_rows;
  int64_t short_factor = 0;
  int panel_var = -1;
  int64_t panel_max = 0;
  std::vector<int> panel_rows;
  int pattern_op = -1;               // a pattern output: the operand whose pattern it takes
  std::vector<int> nonempty;         // ... written only when these variables are non-empty
};

struct Plan {
  PyObject_HEAD
  Spec* spec;
  PyObject* fallback;   // the Python runner: ops -> result or None
  PyObject* threads;    // work -> thread count (used from min_work on)
  PyObject* choose;     // choose_panel(widths, extent, nnz, rows)
  PyObject* widths;
  PyObject* pointers;   // storage_pointers(storage) when not cached yet
  PyObject* short_getter;   // () -> the short-rows variant's capsule, or None (not built yet)
  PyObject* finish;         // a pattern output: (pattern storage, values, sizes) -> Storage
};

PyTypeObject PlanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* s_sig = nullptr;
PyObject* s_ptrs = nullptr;
PyObject* s_shape = nullptr;

// -- construction ------------------------------------------------------------------

bool as_int(PyObject* o, int64_t* v) {
  *v = PyLong_AsLongLong(o);
  return !(*v == -1 && PyErr_Occurred());
}

bool int_list(PyObject* seq, std::vector<int>* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; i++) {
    int64_t v;
    if (!as_int(PySequence_Fast_GET_ITEM(fast, i), &v)) { Py_DECREF(fast); return false; }
    out->push_back((int)v);
  }
  Py_DECREF(fast);
  return true;
}

bool scalar_type_of(PyObject* example, at::ScalarType* out) {
  if (!THPVariable_Check(example)) {
    PyErr_SetString(PyExc_TypeError, "fastcall: dtype examples must be tensors");
    return false;
  }
  *out = THPVariable_Unpack(example).scalar_type();
  return true;
}

KernelFn kernel_of(PyObject* capsule) {
  return reinterpret_cast<KernelFn>(PyCapsule_GetPointer(capsule, kCapsule));
}

// parse one entry of the spec dict: a sequence of tuples of ints (or an example tensor)
bool parse_spec(PyObject* d, Spec* s) {
  PyObject* o;
  if (!(o = PyDict_GetItemString(d, "operands"))) goto missing;
  {
    PyObject* fast = PySequence_Fast(o, "operands");
    if (!fast) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
      PyObject* t = PySequence_Fast_GET_ITEM(fast, i);
      Operand op{0, -1, at::kFloat, 0};
      int64_t kind, sig, ndim;
      if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4 || !as_int(PyTuple_GET_ITEM(t, 0), &kind) ||
          !as_int(PyTuple_GET_ITEM(t, 1), &sig) || !as_int(PyTuple_GET_ITEM(t, 3), &ndim)) {
        Py_DECREF(fast);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fastcall: bad operand entry");
        return false;
      }
      op.kind = (int)kind; op.sig = sig; op.ndim = (int)ndim;
      if (kind == kDense && !scalar_type_of(PyTuple_GET_ITEM(t, 2), &op.dtype)) {
        Py_DECREF(fast);
        return false;
      }
      s->ops.push_back(op);
    }
    Py_DECREF(fast);
  }
  if (!(o = PyDict_GetItemString(d, "dims"))) goto missing;
  {
    std::vector<int> flat;
    if (!int_list(o, &flat)) return false;
    for (size_t i = 0; i + 3 <= flat.size(); i += 3)
      s->dims.push_back({flat[i], flat[i + 1], flat[i + 2]});
  }
  if (!(o = PyDict_GetItemString(d, "unit"))) goto missing;
  {
    std::vector<int> flat;
    if (!int_list(o, &flat)) return false;
    for (size_t i = 0; i + 2 <= flat.size(); i += 2)
      s->unit.push_back({flat[i], flat[i + 1]});
  }
  if ((o = PyDict_GetItemString(d, "order"))) {   // optional
    std::vector<int> flat;
    if (!int_list(o, &flat)) return false;
    for (size_t i = 0; i + 3 <= flat.size(); i += 3)
      s->order.push_back({flat[i], flat[i + 1], flat[i + 2]});
  }
  if (!(o = PyDict_GetItemString(d, "args"))) goto missing;
  {
    PyObject* fast = PySequence_Fast(o, "args");
    if (!fast) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
      PyObject* t = PySequence_Fast_GET_ITEM(fast, i);
      int64_t kind, a, b;
      if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 || !as_int(PyTuple_GET_ITEM(t, 0), &kind) ||
          !as_int(PyTuple_GET_ITEM(t, 1), &a) || !as_int(PyTuple_GET_ITEM(t, 2), &b)) {
        Py_DECREF(fast);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fastcall: bad argument entry");
        return false;
      }
      s->args.push_back({(int)kind, (int)a, b});
    }
    Py_DECREF(fast);
  }
  {
    int64_t v;
    if (!(o = PyDict_GetItemString(d, "nvars")) || !as_int(o, &v)) goto missing;
    s->nvars = (int)v;
    if (!(o = PyDict_GetItemString(d, "min_work")) || !as_int(o, &s->min_work)) goto missing;
    if (!(o = PyDict_GetItemString(d, "out_max")) || !as_int(o, &s->out_max)) goto missing;
  }
  if (!(o = PyDict_GetItemString(d, "out_dtype")) || !scalar_type_of(o, &s->out_dtype)) goto missing;
  if (!(o = PyDict_GetItemString(d, "out_vars")) || !int_list(o, &s->out_vars)) goto missing;
  if ((o = PyDict_GetItemString(d, "short")) && o != Py_None) {
    // (operand, rows variables, factor): nnz <= factor * rows picks the short-rows kernel
    int64_t op, f;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3 || !as_int(PyTuple_GET_ITEM(o, 0), &op) ||
        !int_list(PyTuple_GET_ITEM(o, 1), &s->short_rows) || !as_int(PyTuple_GET_ITEM(o, 2), &f))
      goto missing;
    s->short_op = (int)op; s->short_factor = f;
  }
  if ((o = PyDict_GetItemString(d, "panel")) && o != Py_None) {
    // (variable, widest register kernel, rows variables)
    int64_t v, m;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3 || !as_int(PyTuple_GET_ITEM(o, 0), &v) ||
        !as_int(PyTuple_GET_ITEM(o, 1), &m) || !int_list(PyTuple_GET_ITEM(o, 2), &s->panel_rows))
      goto missing;
    s->panel_var = (int)v; s->panel_max = m;
  }
  if ((o = PyDict_GetItemString(d, "pattern")) && o != Py_None) {
    // (operand, variables that must be non-empty): the output's values on its pattern
    int64_t op;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !as_int(PyTuple_GET_ITEM(o, 0), &op) ||
        !int_list(PyTuple_GET_ITEM(o, 1), &s->nonempty))
      goto missing;
    s->pattern_op = (int)op;
  }
  if ((int)s->ops.size() > kMaxOps || s->nvars > kMaxVars || (int)s->args.size() > kMaxArgs ||
      (int)s->out_vars.size() > kMaxVars) {
    PyErr_SetString(PyExc_ValueError, "fastcall: plan too large");
    return false;
  }
  for (const Dim& dm : s->dims)
    if (dm.op < 0 || dm.op >= (int)s->ops.size() || dm.var < 0 || dm.var >= s->nvars) {
      PyErr_SetString(PyExc_ValueError, "fastcall: dimension entry out of range");
      return false;
    }
  for (const Dim& dm : s->dims)
    if (s->ops[dm.op].kind == kDense && (dm.dim < 0 || dm.dim >= s->ops[dm.op].ndim)) {
      PyErr_SetString(PyExc_ValueError, "fastcall: dimension beyond a dense operand's rank");
      return false;
    }
  for (const std::vector<int>* vs : {&s->short_rows, &s->panel_rows})
    for (int v : *vs)
      if (v < 0 || v >= s->nvars) {
        PyErr_SetString(PyExc_ValueError, "fastcall: rows variable out of range");
        return false;
      }
  if (s->panel_var >= s->nvars) {
    PyErr_SetString(PyExc_ValueError, "fastcall: panel variable out of range");
    return false;
  }
  for (auto& u : s->unit)
    if (u.first < 0 || u.first >= (int)s->ops.size() || s->ops[u.first].kind != kDense ||
        u.second < 0 || u.second >= s->ops[u.first].ndim) {
      PyErr_SetString(PyExc_ValueError, "fastcall: unit-stride entry names no dense operand");
      return false;
    }
  for (auto& u : s->order)
    if (u[0] < 0 || u[0] >= (int)s->ops.size() || s->ops[u[0]].kind != kDense ||
        u[1] < 0 || u[1] >= s->ops[u[0]].ndim || u[2] < 0 || u[2] >= s->ops[u[0]].ndim) {
      PyErr_SetString(PyExc_ValueError, "fastcall: loop-order entry names no dense operand");
      return false;
    }
  for (const Arg& a : s->args) {
    bool ok = true;
    if (a.kind == kSize) ok = a.a >= 0 && a.a < s->nvars;
    else if (a.kind == kStorage) ok = a.a >= 0 && a.a < (int)s->ops.size() && s->ops[a.a].kind == kSparse;
    else if (a.kind == kData || a.kind == kStride)
      ok = a.a >= 0 && a.a < (int)s->ops.size() && s->ops[a.a].kind == kDense &&
           (a.kind == kData || (a.b >= 0 && a.b < (int64_t(1) << s->ops[a.a].ndim)));
    else ok = a.kind == kOut || a.kind == kOutStride;
    if (!ok) {
      PyErr_SetString(PyExc_ValueError, "fastcall: argument entry out of range");
      return false;
    }
  }
  if (s->short_op >= 0 && (s->short_op >= (int)s->ops.size() || s->ops[s->short_op].kind != kSparse)) {
    PyErr_SetString(PyExc_ValueError, "fastcall: short-rows operand is not sparse");
    return false;
  }
  if (s->pattern_op >= 0 && (s->pattern_op >= (int)s->ops.size() || s->ops[s->pattern_op].kind != kSparse)) {
    PyErr_SetString(PyExc_ValueError, "fastcall: pattern operand is not sparse");
    return false;
  }
  for (int v : s->nonempty)
    if (v < 0 || v >= s->nvars) {
      PyErr_SetString(PyExc_ValueError, "fastcall: non-empty variable out of range");
      return false;
    }
  for (int v : s->out_vars)
    if (v < 0 || v >= s->nvars) {
      PyErr_SetString(PyExc_ValueError, "fastcall: output variable out of range");
      return false;
    }
  return true;
missing:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fastcall: incomplete plan spec");
  return false;
}

// A plan takes part in garbage collection: its fallback (the Python runner) refers back
// to the plan cache entry that holds the plan.
int plan_traverse(PyObject* self, visitproc visit, void* arg) {
  Plan* p = reinterpret_cast<Plan*>(self);
  Py_VISIT(p->fallback);
  Py_VISIT(p->threads);
  Py_VISIT(p->choose);
  Py_VISIT(p->widths);
  Py_VISIT(p->pointers);
  Py_VISIT(p->short_getter);
  Py_VISIT(p->finish);
  return 0;
}

int plan_clear(PyObject* self) {
  Plan* p = reinterpret_cast<Plan*>(self);
  Py_CLEAR(p->fallback);
  Py_CLEAR(p->threads);
  Py_CLEAR(p->choose);
  Py_CLEAR(p->widths);
  Py_CLEAR(p->pointers);
  Py_CLEAR(p->short_getter);
  Py_CLEAR(p->finish);
  return 0;
}

void plan_dealloc(PyObject* self) {
  Plan* p = reinterpret_cast<Plan*>(self);
  PyObject_GC_UnTrack(self);
  plan_clear(self);
  delete p->spec;
  p->spec = nullptr;
  Py_TYPE(self)->tp_free(self);
}

// Plan(kernel_capsule, short_getter_or_None, fallback, threads, choose, widths, pointers, spec)
int plan_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  Plan* p = reinterpret_cast<Plan*>(self);
  PyObject *kernel, *short_kernel, *fallback, *threads, *choose, *widths, *pointers, *spec;
  if (!PyArg_ParseTuple(args, "OOOOOOOO!", &kernel, &short_kernel, &fallback, &threads, &choose,
                        &widths, &pointers, &PyDict_Type, &spec))
    return -1;
  std::unique_ptr<Spec> s(new Spec());
  s->kernel = kernel_of(kernel);
  if (!s->kernel) return -1;
  if (!parse_spec(spec, s.get())) return -1;
  PyObject* finish = PyDict_GetItemString(spec, "finish");   // borrowed
  if (s->pattern_op >= 0 && (!finish || !PyCallable_Check(finish))) {
    PyErr_SetString(PyExc_ValueError, "fastcall: a pattern output needs a callable 'finish'");
    return -1;
  }
  Py_XINCREF(finish);
  Py_XSETREF(p->finish, finish);
  delete p->spec;
  p->spec = s.release();
  PyObject** slots[] = {&p->fallback, &p->threads, &p->choose, &p->widths, &p->pointers,
                        &p->short_getter};
  PyObject* values[] = {fallback, threads, choose, widths, pointers, short_kernel};
  for (int i = 0; i < 6; i++) {
    Py_INCREF(values[i]);
    Py_XSETREF(*slots[i], values[i]);
  }
  return 0;
}

// -- the call ----------------------------------------------------------------------

struct Held {   // new references dropped at the end of a call
  PyObject* refs[4 * kMaxOps];   // _sig, _ptrs (and a computed one), shape per operand
  int n = 0;
  ~Held() { for (int i = 0; i < n; i++) Py_DECREF(refs[i]); }
  PyObject* keep(PyObject* o) { if (o) refs[n++] = o; return o; }
};

// item b (< 0: from the end) of a storage_pointers tuple; -1 with an error set when absent
int64_t ptr_item(PyObject* ptrs, int64_t b) {
  Py_ssize_t n = PyTuple_GET_SIZE(ptrs);
  Py_ssize_t i = b < 0 ? n + b : b;
  if (i < 0 || i >= n) {
    PyErr_SetString(PyExc_IndexError, "storage pointer index out of range");
    return -1;
  }
  return PyLong_AsLongLong(PyTuple_GET_ITEM(ptrs, i));
}

int64_t product(const int64_t* vars, const std::vector<int>& which) {
  int64_t p = 1;
  for (int v : which) p *= vars[v];
  return p;
}

// The plan's answer, or nullptr with no error set: the operands need the Python runner.
PyObject* try_fast(Plan* self, PyObject* list) {
  const Spec& s = *self->spec;
  const int nops = (int)s.ops.size();
  if (!PyList_Check(list) || PyList_GET_SIZE(list) != nops) return nullptr;
  Held held;
  const at::Tensor* dense[kMaxOps] = {nullptr};
  PyObject* ptrs[kMaxOps] = {nullptr};
  PyObject* shapes[kMaxOps] = {nullptr};
  int64_t work = 0;
  for (int n = 0; n < nops; n++) {
    PyObject* x = PyList_GET_ITEM(list, n);
    const Operand& op = s.ops[n];
    if (op.kind == kSparse) {
      PyObject* sig = held.keep(PyObject_GetAttr(x, s_sig));
      if (!sig || !PyLong_Check(sig) || PyLong_AsLongLong(sig) != op.sig) { PyErr_Clear(); return nullptr; }
      PyObject* p = held.keep(PyObject_GetAttr(x, s_ptrs));
      if (p == Py_None) p = held.keep(PyObject_CallOneArg(self->pointers, x));
      if (!p || !PyTuple_Check(p)) { PyErr_Clear(); return nullptr; }
      PyObject* shape = held.keep(PyObject_GetAttr(x, s_shape));
      if (!shape || !PyTuple_Check(shape)) { PyErr_Clear(); return nullptr; }
      ptrs[n] = p;
      shapes[n] = shape;
      work += ptr_item(p, -1);
      if (PyErr_Occurred()) { PyErr_Clear(); return nullptr; }
    } else if (op.kind == kDense) {
      // a subclass may keep no memory of its own (a wrapper subclass): the Python path checks
      if (!THPVariable_CheckExact(x)) return nullptr;
      const at::Tensor& t = THPVariable_Unpack(x);
      if (t.is_nested() || t.scalar_type() != op.dtype || t.dim() != op.ndim || t.layout() != at::kStrided ||
          !t.has_storage() || !t.is_cpu() ||   // other devices: the Python path says why
          t._is_zerotensor() ||                // no memory behind it: the Python path makes some
          t.is_neg() || t.is_conj())           // a lazy sign / conjugate: the Python path resolves it
        return nullptr;
      dense[n] = &t;
      work += t.numel();
    }
  }
  int64_t vars[kMaxVars];
  bool set[kMaxVars] = {false};
  for (const Dim& d : s.dims) {
    int64_t size;
    if (s.ops[d.op].kind == kSparse) {
      if (d.dim >= PyTuple_GET_SIZE(shapes[d.op])) return nullptr;
      size = PyLong_AsLongLong(PyTuple_GET_ITEM(shapes[d.op], d.dim));
    } else {
      size = dense[d.op]->size(d.dim);
    }
    if (!set[d.var]) { vars[d.var] = size; set[d.var] = true; }
    else if (vars[d.var] != size) return nullptr;   // broadcasts and errors: Python runner
  }
  for (auto& u : s.unit) {
    const at::Tensor& t = *dense[u.first];
    if (t.stride(u.second) != 1 && t.size(u.second) > 1) return nullptr;   // re-layout first
  }
  for (auto& u : s.order) {   // nested against the loops (relayout.out_of_order): Python runner
    const at::Tensor& t = *dense[u[0]];
    if (t.stride(u[2]) > t.stride(u[1]) && t.size(u[2]) > 1 && t.size(u[1]) > 1) return nullptr;
  }
  int64_t out_sizes[kMaxVars];
  int out_rank = (int)s.out_vars.size();
  for (int d = 0; d < out_rank; d++) out_sizes[d] = vars[s.out_vars[d]];
  if (s.pattern_op >= 0) {   // the values of the pattern operand's entries
    for (int v : s.nonempty)
      if (vars[v] == 0) return nullptr;   // an empty reduction stores nothing: Python runner
    out_rank = 1;
    out_sizes[0] = ptr_item(ptrs[s.pattern_op], -1);
    if (PyErr_Occurred()) { PyErr_Clear(); return nullptr; }
  }
  if ((s.pattern_op >= 0 ? out_sizes[0] : product(vars, s.out_vars)) >= s.out_max) return nullptr;
  int nthreads = 1;
  if (work >= s.min_work) {
    PyObject* r = PyObject_CallFunction(self->threads, "L", (long long)work);
    if (!r) return nullptr;
    nthreads = (int)PyLong_AsLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) return nullptr;
  }
  KernelFn kernel = s.kernel;
  if (s.short_op >= 0 && ptr_item(ptrs[s.short_op], -1) <= s.short_factor * product(vars, s.short_rows)) {
    if (!s.short_kernel) {   // built on first need by the general path
      if (self->short_getter == Py_None) return nullptr;
      PyObject* cap = PyObject_CallNoArgs(self->short_getter);
      if (!cap) return nullptr;
      if (cap != Py_None) self->spec->short_kernel = kernel_of(cap);
      Py_DECREF(cap);   // the module (kept by the plan's entry) owns the function
      if (PyErr_Occurred()) return nullptr;
      if (!s.short_kernel) return nullptr;
    }
    kernel = s.short_kernel;
  }
  int panel = 0;
  if (s.panel_var >= 0 && vars[s.panel_var] > s.panel_max) {
    int64_t nnz = 0;
    for (int n = 0; n < nops; n++)
      if (s.ops[n].kind == kSparse) nnz += ptr_item(ptrs[n], -1);
    PyObject* r = PyObject_CallFunction(self->choose, "OLLL", self->widths, (long long)vars[s.panel_var],
                                        (long long)nnz, (long long)product(vars, s.panel_rows));
    if (!r) return nullptr;
    panel = (int)PyLong_AsLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) return nullptr;
  }
  at::Tensor out = at::empty(at::IntArrayRef(out_sizes, out_rank), at::TensorOptions().dtype(s.out_dtype));
  int64_t values[kMaxArgs];
  int i = 0;
  for (const Arg& a : s.args) {
    int64_t v = 0;
    switch (a.kind) {
      case kSize: v = vars[a.a]; break;
      case kStorage: v = ptr_item(ptrs[a.a], a.b); break;
      case kData: v = (int64_t)(intptr_t)dense[a.a]->data_ptr(); break;
      case kStride:
        for (int d = 0; d < 63; d++)
          if (a.b & (int64_t(1) << d)) v += dense[a.a]->stride(d);
        break;
      case kOut: v = (int64_t)(intptr_t)out.data_ptr(); break;
      case kOutStride: {
        v = 1;
        for (int k = 0; k < s.nvars; k++)
          if (a.b & (int64_t(1) << k)) v *= vars[k];
        break;
      }
    }
    values[i++] = v;
  }
  if (PyErr_Occurred()) { PyErr_Clear(); return nullptr; }
  Py_BEGIN_ALLOW_THREADS
  kernel(values, nthreads, panel);
  Py_END_ALLOW_THREADS
  PyObject* result = THPVariable_Wrap(std::move(out));
  if (s.pattern_op < 0 || !result) return result;
  PyObject* sizes = PyTuple_New(s.nvars);
  if (!sizes) { Py_DECREF(result); return nullptr; }
  for (int v = 0; v < s.nvars; v++) {
    PyObject* size = PyLong_FromLongLong(vars[v]);
    if (!size) { Py_DECREF(sizes); Py_DECREF(result); return nullptr; }
    PyTuple_SET_ITEM(sizes, v, size);   // steals
  }
  PyObject* storage = PyObject_CallFunctionObjArgs(self->finish, PyList_GET_ITEM(list, s.pattern_op),
                                                   result, sizes, nullptr);
  Py_DECREF(sizes);
  Py_DECREF(result);
  return storage;
}

PyObject* guarded_try(Plan* self, PyObject* ops) {
  if (!self->spec || !self->fallback) {   // before __init__, or cleared by the collector
    PyErr_SetString(PyExc_RuntimeError, "fastcall.Plan is not initialized");
    return nullptr;
  }
  try {
    return try_fast(self, ops);
  } catch (const std::exception& e) {   // e.g. at::empty out of memory
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* plan_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  Plan* p = reinterpret_cast<Plan*>(self);
  if (PyTuple_GET_SIZE(args) != 1 || kwargs) {
    PyErr_SetString(PyExc_TypeError, "a plan takes the list of operands");
    return nullptr;
  }
  PyObject* ops = PyTuple_GET_ITEM(args, 0);
  PyObject* r = guarded_try(p, ops);
  if (r || PyErr_Occurred()) return r;
  return PyObject_CallOneArg(p->fallback, ops);
}

PyObject* plan_try(PyObject* self, PyObject* ops) {
  // the fast path alone (tests): the result, or None where the Python runner would run
  PyObject* r = guarded_try(reinterpret_cast<Plan*>(self), ops);
  if (r || PyErr_Occurred()) return r;
  Py_RETURN_NONE;
}

// -- plan lookup ---------------------------------------------------------------------

PyObject* g_storage_type = nullptr;   // scorch.level_storage.Storage
PyObject* g_sparse_type = nullptr;    // scorch.SparseTensor
PyObject* s_storage = nullptr;
PyObject* s_runner = nullptr;
int64_t g_hits = 0;

PyObject* configure(PyObject*, PyObject* args) {
  PyObject *storage, *sparse;
  if (!PyArg_ParseTuple(args, "OO", &storage, &sparse)) return nullptr;
  Py_INCREF(storage);
  Py_INCREF(sparse);
  Py_XSETREF(g_storage_type, storage);
  Py_XSETREF(g_sparse_type, sparse);
  Py_RETURN_NONE;
}

// dispatch(table, equation, operands): the warm einsum call, start to end, for Storages,
// SparseTensors and plain dense tensors, when ``table`` (the compiler's plan cache keyed
// like ``tensor_compiler.einsum`` keys it) holds the plan and its runner takes the call.
// NotImplemented otherwise: the Python path then does the same lookup and handles the rest.
PyObject* dispatch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyDict_Check(args[0]) || !PyTuple_Check(args[2]) || !g_storage_type)
    Py_RETURN_NOTIMPLEMENTED;
  PyObject* operands = args[2];
  const Py_ssize_t n = PyTuple_GET_SIZE(operands);
  if (n > kMaxOps) Py_RETURN_NOTIMPLEMENTED;
  PyObject* ops = PyList_New(n);
  if (!ops) return nullptr;
  // the key's items (new references) are collected first, then moved into a tuple of the
  // exact length: a sparse operand adds its signature, a dense one its dtype and rank (with its extents of 1)
  PyObject* items[2 + 2 * kMaxOps];
  Py_ssize_t k = 0;
  Py_INCREF(args[1]);
  items[k++] = args[1];
  Py_INCREF(Py_None);
  items[k++] = Py_None;
  bool decline = false;
  for (Py_ssize_t i = 0; i < n && !decline; i++) {
    PyObject* x = PyTuple_GET_ITEM(operands, i);
    PyObject* st = nullptr;
    if ((PyObject*)Py_TYPE(x) == g_sparse_type) {
      st = PyObject_GetAttr(x, s_storage);
      if (!st) { PyErr_Clear(); decline = true; break; }
    } else if ((PyObject*)Py_TYPE(x) == g_storage_type) {
      Py_INCREF(x);
      st = x;
    }
    if (st) {
      PyList_SET_ITEM(ops, i, st);   // steals
      PyObject* sig = PyObject_GetAttr(st, s_sig);
      if (!sig) { PyErr_Clear(); decline = true; break; }
      if (sig == Py_None) { Py_DECREF(sig); decline = true; break; }   // Python computes it
      items[k++] = sig;
    } else if (THPVariable_CheckExact(x)) {
      const at::Tensor& t = THPVariable_Unpack(x);
      if (t.layout() != at::kStrided || t.is_nested() || t.requires_grad() || t.is_neg() ||
          t.is_conj()) {
        decline = true;   // (a lazy sign or conjugate: the Python path resolves it)
        break;
      }
      Py_INCREF(x);
      PyList_SET_ITEM(ops, i, x);
      PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
      Py_INCREF(dtype);
      items[k++] = dtype;
      long rank = (long)t.dim();   // with the extents of 1 in bits 8 and up (planner.unit_mask)
      for (int64_t d = 0; d < t.dim() && d < 55; d++)   // (past 55 dims the keys differ:
        if (t.size(d) == 1) rank |= 1L << (8 + d);      // the Python path takes the call)
      items[k++] = PyLong_FromLong(rank);
    } else {
      decline = true;
    }
  }
  PyObject* result = nullptr;
  if (decline) {
    for (Py_ssize_t j = 0; j < k; j++) Py_DECREF(items[j]);
  } else {
    PyObject* key = PyTuple_New(k);
    if (key) {
      for (Py_ssize_t j = 0; j < k; j++) PyTuple_SET_ITEM(key, j, items[j]);   // steals
    } else {
      for (Py_ssize_t j = 0; j < k; j++) Py_DECREF(items[j]);
    }
    PyObject* entry = key ? PyDict_GetItemWithError(args[0], key) : nullptr;   // borrowed
    Py_XDECREF(key);
    if (entry) {
      PyObject* runner = PyObject_GetAttr(entry, s_runner);
      if (runner && (PyObject*)Py_TYPE(runner) == (PyObject*)&PlanType) {
        result = guarded_try(reinterpret_cast<Plan*>(runner), ops);
        if (result) g_hits++;
      }
      Py_XDECREF(runner);
    }
    if (!result && PyErr_Occurred()) PyErr_Clear();
  }
  Py_DECREF(ops);   // unset items (a declined call) are NULL; deallocation skips them
  if (result) return result;
  Py_RETURN_NOTIMPLEMENTED;
}

PyObject* hits(PyObject*, PyObject*) { return PyLong_FromLongLong(g_hits); }

PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "configure(Storage, SparseTensor): the operand types."},
    {"dispatch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(dispatch)),
     METH_FASTCALL, "dispatch(table, equation, operands) -> result or NotImplemented."},
    {"hits", hits, METH_NOARGS, "Warm calls served by dispatch."},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef plan_members[] = {
    {"fallback", T_OBJECT, offsetof(Plan, fallback), READONLY, "The Python runner it falls back to."},
    {nullptr, 0, 0, 0, nullptr}};

PyMethodDef plan_methods[] = {
    {"try_fast", plan_try, METH_O, "The fast path alone: the result, or None."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, nullptr,
                          "scorch's warm-call path in C (see fastcall.cpp)", -1, module_methods};

}  // namespace

#ifndef SCORCH_FASTCALL_MODULE
#error "build with -DSCORCH_FASTCALL_MODULE=<module name>"
#endif
#define SCORCH_CAT(a, b) a##b
#define SCORCH_INIT(name) SCORCH_CAT(PyInit_, name)
#define SCORCH_STR2(x) #x
#define SCORCH_STR(x) SCORCH_STR2(x)

PyMODINIT_FUNC SCORCH_INIT(SCORCH_FASTCALL_MODULE)(void) {
  module_def.m_name = SCORCH_STR(SCORCH_FASTCALL_MODULE);
  PlanType.tp_name = "scorch.fastcall.Plan";
  PlanType.tp_basicsize = sizeof(Plan);
  PlanType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  PlanType.tp_traverse = plan_traverse;
  PlanType.tp_clear = plan_clear;
  PlanType.tp_new = PyType_GenericNew;
  PlanType.tp_init = plan_init;
  PlanType.tp_dealloc = plan_dealloc;
  PlanType.tp_call = plan_call;
  PlanType.tp_methods = plan_methods;
  PlanType.tp_members = plan_members;
  PlanType.tp_doc = "A compiled kernel's warm-call plan: plan(ops) -> result.";
  if (PyType_Ready(&PlanType) < 0) return nullptr;
  s_sig = PyUnicode_InternFromString("_sig");
  s_ptrs = PyUnicode_InternFromString("_ptrs");
  s_shape = PyUnicode_InternFromString("shape");
  s_storage = PyUnicode_InternFromString("_storage");
  s_runner = PyUnicode_InternFromString("runner");
  if (!s_sig || !s_ptrs || !s_shape || !s_storage || !s_runner) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&PlanType);
  if (PyModule_AddObject(m, "Plan", reinterpret_cast<PyObject*>(&PlanType)) < 0) {
    Py_DECREF(&PlanType);
    Py_DECREF(m);
    return nullptr;
  }
  PyModule_AddStringConstant(m, "CAPSULE", kCapsule);
  return m;
}
