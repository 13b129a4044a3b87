"""Kernels without Cython's module code: the Cython subset codegen prints, lowered to C++.

Why: Cython wraps even a 100-line kernel in ~6,500 lines of module code (argument parsing,
error handling, module state), and g++ -O3 spends ~0.7 s of an average ~1.4 s kernel compile
on that code, after ~0.2 s of Cython itself. A kernel's body holds no Python object: its entry
is ``kernel_c`` (raw pointers in, dense output written in place: the C fast path's entry) or
``kernel_result_c`` (a sparse output's arrays handed over as raw blocks in a
``KernelResult``, ``scorch/_runtime/kernel_result.h``). For those kernels this module prints
the same functions as plain C++ (``static`` functions, ``#pragma omp`` for ``prange``) plus a
40-line Python module (``kernel(list, nthreads, panel=0)``, and the ``KERNEL_C`` capsule or a
call of ``scorch._runtime.result``'s ``RESULT_TO_PYTHON``), and the compile takes ~0.1 s plus
the kernel's own code.

It reads the printed ``.pyx`` rather than the loop IR so that the source users read, the
golden tests and the cache key stay one text. It accepts only the subset ``codegen`` prints
and says :class:`Unsupported` at the first thing outside it (Python objects, ``raise``,
method calls outside ``nogil`` functions other than a local ``vector``'s, ``and`` / ``or``
used as values, chained comparisons, ``/`` in a kernel on integers, ``for ... else``, Python
strings): the kernel then goes through Cython as before. The C++ keeps Cython's meaning:
locals hoisted to the function top, a range loop's bound read once and its variable left at
the last value, ``prange`` bodies with a private loop variable. In a ``nogil`` function no
Python object can be, so every method call there is C++'s; ``name[T](...)`` with C types in
the brackets is a template call; ``b"..."`` is a C string.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["Unsupported", "to_cpp", "MODULE_MACRO"]

#: The compile command defines this macro as the module's name (``PyInit_<name>``): the
#: name carries the hash of the source, so the source cannot spell it.
MODULE_MACRO = "SCORCH_MODULE"


class Unsupported(Exception):
    """The source leaves the subset this module lowers; build it with Cython."""


_INCLUDES = {
    "libc.stdint": "<stdint.h>", "libc.string": "<string.h>", "libc.math": "<math.h>",
    "libc.stdlib": "<stdlib.h>", "libcpp.vector": "<vector>", "libcpp.map": "<map>",
    "cython.parallel": None, "cython.operator": None,
    # the runtime's headers (namespace scorch), on the kernels' include path
    "scorch._runtime.workspace": '"workspace.h"', "scorch._runtime.result": '"kernel_result.h"',
}
#: C type names a template argument list may hold (``dense_scratch[float](n)``)
_TYPE_WORDS = {"float", "double", "int", "bint", "char", "int8_t", "int16_t", "int32_t", "int64_t",
               "uint8_t", "size_t", "const", "*"}
#: Methods of a local ``vector`` (a value, not a pointer) that kernels call; in a ``nogil``
#: function, where no Python object can be, any method call is C++'s.
_VECTOR_METHODS = {"resize", "data", "size", "clear", "reserve", "push_back"}
_TEMPLATES = {"vector": "std::vector", "cmap": "std::map"}
_INT_VALUE_TYPES = {"int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "bint", "int"}


# --------------------------------------------------------------------------- lines
@dataclass
class _Line:
    indent: int
    text: str
    body: List["_Line"] = field(default_factory=list)
    verbatim: List[str] = field(default_factory=list)   # C text in triple quotes


def _outside_quotes(text: str):
    """``(index, char)`` of the characters of ``text`` outside string literals (the quotes
    themselves left out)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        else:
            yield i, ch


def _strip_comment(text: str) -> str:
    for i, ch in _outside_quotes(text):
        if ch == "#":
            return text[:i].rstrip()
    return text.rstrip()


def _tree(lines: Sequence[str]) -> List[_Line]:
    """Logical lines nested by indentation (a line ending in ``:`` owns the deeper ones)."""
    root: List[_Line] = []
    stack: List[Tuple[int, List[_Line]]] = [(-1, root)]
    owner: Optional[_Line] = None
    quoted: Optional[List[str]] = None
    for raw in lines:
        if quoted is not None:                     # inside a triple-quoted C block
            if raw.strip() == '"""':
                quoted = None
            else:
                quoted.append(raw)
            continue
        if raw.strip() == '"""':
            if owner is None or owner.text != "cdef extern from *:":
                raise Unsupported("a string block outside cdef extern from *")
            quoted = owner.verbatim
            continue
        text = _strip_comment(raw)
        if not text.strip():
            continue
        if text.count("(") != text.count(")") or text.count("[") != text.count("]"):
            raise Unsupported(f"a statement over several lines: {raw.strip()!r}")
        indent = len(text) - len(text.lstrip(" "))
        if "\t" in text[:indent + 1]:
            raise Unsupported("tab indentation")
        while indent <= stack[-1][0]:
            stack.pop()
        node = _Line(indent, text.strip())
        stack[-1][1].append(node)
        if node.text.endswith(":"):
            stack.append((indent, node.body))
            owner = node
    if quoted is not None:
        raise Unsupported("an unterminated string block")
    return root


# --------------------------------------------------------------------------- types
def _ctype(t: str) -> str:
    """A Cython type as C++: ``vector[T]`` -> ``std::vector<T>``, ``cmap[K, V]`` (libcpp's
    map as kernels cimport it) -> ``std::map<K, V>``, ``X[T]`` -> ``X<T>``, ``.iterator`` ->
    ``::iterator``, ``bint`` -> ``int``."""
    t = t.strip()
    while "[" in t:
        u = re.sub(r"\b(\w+)\[([^\[\]]*)\]",
                   lambda m: f"{_TEMPLATES.get(m.group(1), m.group(1))}<{m.group(2)}>", t)
        if u == t:
            break
        t = u
    t = t.replace(">.iterator", ">::iterator")
    t = re.sub(r"\bbint\b", "int", t)
    if not re.fullmatch(r"(const\s+)?[A-Za-z_][\w:<>, ]*\s*\**", t):
        raise Unsupported(f"type {t!r}")
    return t


def _params(text: str) -> List[Tuple[str, str]]:
    """``T0 a, T1* b`` -> [(T0, a), (T1*, b)]."""
    out = []
    for part in _split_top(text, ","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(.*?[\w\]\*])\s*\b([A-Za-z_]\w*)", part)
        if m is None or "=" in part:
            raise Unsupported(f"parameter {part!r}")
        out.append((_ctype(m.group(1)), m.group(2)))
    return out


def _split_top(text: str, sep: str) -> List[str]:
    """Split at ``sep`` outside brackets and quotes."""
    parts, depth, start = [], 0, 0
    for i, ch in _outside_quotes(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


# --------------------------------------------------------------------------- expressions
_TOKEN = re.compile(r"""\s*(?:
    (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<str>b?'[^']*'|b?"[^"]*")
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>\*\*|//|<<|>>|<=|>=|==|!=|[-+*/%&|^~<>()\[\],.=:])
)""", re.X)


def _tokens(text: str) -> List[Tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise Unsupported(f"cannot read {text[pos:]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Expr:
    """Recursive descent over Python's precedence levels; emits fully parenthesized C.

    ``ptrs`` names the locals that are pointers (``p.x`` is ``p->x``), ``fields_ptrs`` the
    ``Args`` fields (a member of one is refused: its type is not known here);
    ``int_values`` forbids ``/``, whose meaning (true division) differs on integers."""

    _COMPARE = ("<", ">", "<=", ">=", "==", "!=")

    def __init__(self, text: str, ptrs: frozenset, int_values: bool,
                 fields_ptrs: frozenset = frozenset(), vectors: frozenset = frozenset(),
                 nogil: bool = False):
        self.toks = _tokens(text)
        self.nogil = nogil
        self.i = 0
        self.ptrs = ptrs
        self.vectors = vectors
        self.fields_ptrs = fields_ptrs
        self.int_values = int_values

    # helpers
    def peek(self, k: int = 0) -> Tuple[str, str]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("end", "")

    def take(self, value: Optional[str] = None) -> Tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise Unsupported(f"expected {value!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def done(self) -> bool:
        return self.i >= len(self.toks)

    # grammar: ``parse`` returns C text; the levels down to ``compare`` return (C text,
    # whether its value is Cython's bint: a comparison or a logical operation)
    def parse(self, want_bool: bool = False) -> str:
        code = self.ternary(want_bool)[0]
        if not self.done():
            raise Unsupported(f"unexpected {self.peek()[1]!r}")
        return code

    def ternary(self, want_bool: bool = False) -> Tuple[str, bool]:
        a = self.or_(want_bool)
        if self.peek() == ("name", "if"):
            self.take()
            cond = self.or_(True)[0]
            self.take("else")
            b = self.ternary(want_bool)
            return f"(({cond}) ? ({a[0]}) : ({b[0]}))", a[1] and b[1]
        return a

    def _logic(self, word: str, sub, want_bool: bool) -> Tuple[str, bool]:
        """``and`` / ``or`` are C's ``&&`` / ``||`` where the result is only tested, or
        where every operand is already 0 or 1 (elsewhere Cython returns an operand)."""
        first = sub(want_bool)
        if self.peek() != ("name", word):
            return first
        parts = [first]
        while self.peek() == ("name", word):
            self.take()
            parts.append(sub(want_bool))
        if not want_bool and not all(b for _, b in parts):
            raise Unsupported(f"{word!r} used as a value")
        return "(" + (" && " if word == "and" else " || ").join(c for c, _ in parts) + ")", True

    def or_(self, want_bool: bool = False) -> Tuple[str, bool]:
        return self._logic("or", self.and_, want_bool)

    def and_(self, want_bool: bool = False) -> Tuple[str, bool]:
        return self._logic("and", self.not_, want_bool)

    def not_(self, want_bool: bool = False) -> Tuple[str, bool]:
        if self.peek() == ("name", "not"):
            self.take()
            return f"(!({self.not_(True)[0]}))", True
        return self.compare(want_bool)

    def compare(self, want_bool: bool = False) -> Tuple[str, bool]:
        start = self.i
        if self.peek() == ("op", "("):     # a parenthesized test keeps the context
            depth, j = 0, self.i
            while j < len(self.toks):
                depth += {"(": 1, ")": -1}.get(self.toks[j][1], 0)
                if depth == 0:
                    break
                j += 1
            nxt = self.toks[j + 1][1] if j + 1 < len(self.toks) else ""
            if nxt in ("", ")", ",", "and", "or", "if", "else", "]", ":"):
                self.take("(")
                inner = self.ternary(want_bool)
                self.take(")")
                if self.i == j + 1:
                    return f"({inner[0]})", inner[1]
            self.i = start
        a = self.binary(0)
        kind, tok = self.peek()
        if kind == "op" and tok in self._COMPARE:
            op = self.take()[1]
            b = self.binary(0)
            if self.peek()[0] == "op" and self.peek()[1] in self._COMPARE:
                raise Unsupported("chained comparison")
            return f"({a} {op} {b})", True
        if (kind, tok) == ("name", "in") and self.peek(1) == ("op", "("):
            self.take()
            self.take("(")
            items = []
            while self.peek()[1] != ")":
                items.append(self.binary(0))
                if self.peek()[1] == ",":
                    self.take()
                elif self.peek()[1] != ")":
                    raise Unsupported("'in' over something other than a tuple")
            self.take(")")
            if not items:
                raise Unsupported("'in' over an empty tuple")
            return "(" + " || ".join(f"({a} == {x})" for x in items) + ")", True
        if (kind, tok) in (("name", "in"), ("name", "is"), ("name", "not")):
            raise Unsupported(f"operator {tok!r}")
        return a, False

    _LEVELS = (("|",), ("^",), ("&",), ("<<", ">>"), ("+", "-"), ("*", "/", "//", "%"))

    def binary(self, level: int) -> str:
        if level == len(self._LEVELS):
            return self.unary()
        a = self.binary(level + 1)
        while self.peek()[0] == "op" and self.peek()[1] in self._LEVELS[level]:
            op = self.take()[1]
            if op == "/" and self.int_values:
                raise Unsupported("'/' in a kernel on integers")
            b = self.binary(level + 1)
            a = f"({a} {'/' if op == '//' else op} {b})"
        return a

    def unary(self) -> str:
        kind, tok = self.peek()
        if kind == "op" and tok in ("-", "+", "~", "&"):
            self.take()
            return f"({tok}{self.unary()})"
        if kind == "op" and tok == "<":          # a cast: <T*>x binds like C's (T*)x
            self.take()
            words = []
            while self.peek()[1] != ">":
                if self.done():
                    raise Unsupported("unterminated cast")
                words.append(self.take()[1])
            self.take(">")
            ctype = _ctype(" ".join(words).replace(" *", "*"))
            if ctype == "object":
                raise Unsupported("a Python object")
            return f"(({ctype}){self.unary()})"
        a = self.postfix()
        if self.peek() == ("op", "**"):
            raise Unsupported("'**'")
        return a

    def postfix(self) -> str:
        kind, tok = self.take()
        if kind == "num":
            a = tok
        elif kind == "str":
            if not tok.startswith("b") or "\\" in tok:
                raise Unsupported("a string")
            a = '"' + tok[2:-1].replace('"', '\\"') + '"'     # bytes: a C string literal
        elif kind == "op" and tok == "(":
            a = f"({self.ternary()[0]})"
            self.take(")")
        elif kind == "name":
            if tok in ("None", "lambda", "yield", "await", "in", "is", "not", "if", "else"):
                raise Unsupported(f"{tok!r}")
            a = {"True": "1", "False": "0"}.get(tok, tok)
            if tok == "sizeof":
                return self.sizeof()
        else:
            raise Unsupported(f"unexpected {tok!r}")
        base_name = tok if kind == "name" else None
        after_pointer_field = False
        while True:
            kind, tok = self.peek()
            if (kind, tok) == ("op", "("):
                self.take()
                args = []
                while self.peek()[1] != ")":
                    args.append(self.ternary()[0])
                    if self.peek()[1] == ",":
                        self.take()
                    elif self.peek()[1] != ")":
                        raise Unsupported(f"call arguments near {self.peek()[1]!r}")
                self.take(")")
                a = self.call(a, args)
                base_name = None
                after_pointer_field = False
            elif (kind, tok) == ("op", "[") and self.template_args() is not None:
                args = self.template_args()
                self.i += len(args) + 2
                a = f"{a}<{' '.join(args).replace(' ,', ',').replace(' *', '*')}>"
            elif (kind, tok) == ("op", "["):
                self.take()
                idx = self.ternary()[0]
                self.take("]")
                a = f"{a}[{idx}]"
                base_name = None
                after_pointer_field = False
            elif (kind, tok) == ("op", "."):
                self.take()
                member = self.take()
                if member[0] != "name":
                    raise Unsupported(f"member {member[1]!r}")
                if self.peek() == ("op", "("):
                    if not self.nogil and (base_name not in self.vectors
                                           or member[1] not in _VECTOR_METHODS):
                        raise Unsupported("a method call")
                    a = f"{a}.{member[1]}"     # the call itself: the next round
                    base_name = None
                    continue
                if base_name is None and after_pointer_field:
                    raise Unsupported("a member of a pointer field")
                a = f"{a}{'->' if base_name in self.ptrs else '.'}{member[1]}"
                after_pointer_field = member[1] in self.fields_ptrs
                base_name = None
                continue
            else:
                return a

    def template_args(self) -> Optional[List[str]]:
        """The tokens of ``[T, ...]`` at the cursor when they are C types and a call follows
        (a template function: ``dense_scratch[float](n)``), else None."""
        j, words = self.i + 1, []
        while j < len(self.toks) and self.toks[j][1] != "]":
            words.append(self.toks[j][1])
            j += 1
        if not words or j + 1 >= len(self.toks) or self.toks[j + 1][1] != "(":
            return None
        if not all(w in _TYPE_WORDS or w == "," for w in words):
            return None
        return words

    def sizeof(self) -> str:
        """``sizeof(T)`` or ``sizeof(expression)``."""
        self.take("(")
        start, words = self.i, []
        while self.peek()[1] != ")":
            if self.done():
                raise Unsupported("unterminated sizeof")
            words.append(self.take()[1])
        self.take(")")
        if all(re.fullmatch(r"\w+|\*", w) for w in words):
            return f"sizeof({_ctype(' '.join(words).replace(' *', '*'))})"
        end, self.i = self.i, start
        inner = self.ternary()[0]
        if self.i != end - 1:
            raise Unsupported("sizeof of an odd expression")
        self.i = end
        return f"sizeof({inner})"

    @staticmethod
    def call(fn: str, args: List[str]) -> str:
        if fn in ("min", "max"):
            if len(args) < 2:
                raise Unsupported(f"{fn} of one argument")
            out = args[0]
            for a in args[1:]:
                out = f"scorch_{fn}({out}, {a})"
            return out
        if fn == "deref" and len(args) == 1:
            return f"(*({args[0]}))"
        if fn == "inc" and len(args) == 1:
            return f"(++({args[0]}))"
        if fn in ("range", "prange", "print", "len", "int", "float", "abs", "object", "list",
                  "tuple", "dict", "isinstance", "str"):
            raise Unsupported(f"Python's {fn}()")
        return f"{fn}({', '.join(args)})"


# --------------------------------------------------------------------------- functions
_DECL = re.compile(r"cdef\s+((?:const\s+)?[A-Za-z_]\w*(?:\[[^=]*?\])?\s*\**)\s+(.+)")
_FUNC = re.compile(r"cdef\s+(?:inline\s+)?(.+?)\s*\b([A-Za-z_]\w*)\s*\((.*)\)\s*"
                   r"((?:noexcept|nogil|except\s+\S+|\s)*):$")
_FOR = re.compile(r"for\s+([A-Za-z_]\w*)\s+in\s+(p?range)\((.*)\):$")
_AUG = ("+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=")


class _Function:
    """One ``cdef`` function: locals hoisted, statements printed in order."""

    def __init__(self, ret: str, name: str, params: List[Tuple[str, str]], body: List[_Line],
                 arg_ptrs: frozenset, int_values: bool, nogil: bool = False):
        self.ret, self.name, self.params = ret, name, params
        self.nogil = nogil
        self.int_values = int_values
        self.decls: Dict[str, str] = {}          # name -> declaration (hoisted)
        self.types: Dict[str, str] = {n: t for t, n in params}
        self.arg_ptrs = arg_ptrs
        self._collect(body)
        ptrs = {n for n, t in self.types.items() if t.endswith("*")}
        self.ptrs = frozenset(ptrs)
        self.vectors = frozenset(n for n, t in self.types.items()
                                 if t.startswith("std::vector<") and not t.endswith("*"))
        self.out: List[str] = []
        self.loops = 0
        self.block(body, 1)

    def _collect(self, body: List[_Line]) -> None:
        for line in body:
            if line.text.startswith("cdef "):
                m = _DECL.fullmatch(line.text)
                if m is None:
                    raise Unsupported(f"declaration {line.text!r}")
                ctype = _ctype(m.group(1))
                for d in _split_top(m.group(2), ","):
                    name, dims = self._declarator(d)
                    if name in self.decls or name in self.types:
                        raise Unsupported(f"{name} declared twice")
                    self.types[name] = ctype
                    self.decls[name] = f"{ctype} {name}{dims};"
            self._collect(line.body)

    @staticmethod
    def _declarator(d: str) -> Tuple[str, str]:
        target = d.split("=", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z_]\w*)((?:\[\d+\])*)", target)
        if m is None:
            raise Unsupported(f"declarator {target!r}")
        return m.group(1), m.group(2)

    def expr(self, text: str, want_bool: bool = False) -> str:
        return _Expr(text, self.ptrs, self.int_values, self.arg_ptrs, self.vectors,
                     self.nogil).parse(want_bool)

    def emit(self, depth: int, text: str) -> None:
        self.out.append("    " * depth + text)

    def block(self, body: List[_Line], depth: int) -> None:
        prev = None
        for line in body:
            self.statement(line, depth, prev)
            prev = line

    def statement(self, line: _Line, depth: int, prev: Optional[_Line]) -> None:
        t = line.text
        if t.startswith("cdef "):
            m = _DECL.fullmatch(t)
            for d in _split_top(m.group(2), ","):
                if "=" in d:
                    name = self._declarator(d)[0]
                    self.emit(depth, f"{name} = {self.expr(d.split('=', 1)[1])};")
            return
        m = _FOR.fullmatch(t)
        if m:
            self.for_loop(m.group(1), m.group(2), m.group(3), line.body, depth)
            return
        for word in ("while", "if", "elif"):
            if t.startswith(word + " ") and t.endswith(":"):
                cond = self.expr(t[len(word):-1], want_bool=True)
                if word == "elif" and (prev is None or not prev.text.startswith(("if ", "elif "))):
                    raise Unsupported("elif without if")
                self.emit(depth, f"{'else if' if word == 'elif' else word} ({cond}) {{")
                self.block(line.body, depth + 1)
                self.emit(depth, "}")
                return
        if t == "else:":
            if prev is None or not prev.text.startswith(("if ", "elif ")):
                raise Unsupported("else after a loop")
            self.emit(depth, "else {")
            self.block(line.body, depth + 1)
            self.emit(depth, "}")
            return
        if t == "with nogil:":
            self.emit(depth, "{")
            self.block(line.body, depth + 1)
            self.emit(depth, "}")
            return
        if t.endswith(":"):
            raise Unsupported(f"block {t!r}")
        if t in ("pass",):
            return
        if t in ("break", "continue"):
            self.emit(depth, t + ";")
            return
        if t == "return" or t.startswith("return "):
            value = t[6:].strip()
            if value and self.ret == "void":
                raise Unsupported("a value returned from a void function")
            self.emit(depth, f"return {self.expr(value)};" if value else "return;")
            return
        if t.startswith(("raise", "del ", "global ", "nonlocal ", "with ", "try", "assert")):
            raise Unsupported(f"statement {t.split()[0]!r}")
        for op in _AUG:
            parts = t.split(f" {op} ", 1)
            if len(parts) == 2 and "=" not in parts[0]:
                if op == "/=" and self.int_values:
                    raise Unsupported("'/=' in a kernel on integers")
                self.emit(depth, f"{self.expr(parts[0])} {op} {self.expr(parts[1])};")
                return
        parts = _split_assign(t)
        if parts is not None:
            target, value = parts
            if "," in _split_top(target, ",")[0] or len(_split_top(target, ",")) > 1:
                raise Unsupported("tuple assignment")
            self.emit(depth, f"{self.expr(target)} = {self.expr(value)};")
            return
        self.emit(depth, f"{self.expr(t)};")

    def for_loop(self, var: str, kind: str, args: str, body: List[_Line], depth: int) -> None:
        if var not in self.types:
            raise Unsupported(f"loop variable {var} is not declared")
        parts = [p.strip() for p in _split_top(args, ",")]
        kw = [p for p in parts if "=" in p and not re.search(r"[=!<>]=", p)]
        pos = [p for p in parts if p not in kw]
        step = "1"
        if len(pos) == 3:
            step = pos.pop()
            if not re.fullmatch(r"-?\d+", step) or int(step) == 0:
                raise Unsupported(f"range step {step!r}")
        if len(pos) == 1:
            lo, hi = "0", self.expr(pos[0])
        elif len(pos) == 2:
            lo, hi = self.expr(pos[0]), self.expr(pos[1])
        else:
            raise Unsupported(f"range({args})")
        n = self.loops
        self.loops += 1
        ctype = self.types[var]
        cmp = "<" if int(step) > 0 else ">"
        self.emit(depth, "{")
        self.emit(depth + 1, f"{ctype} scorch_end{n} = {hi};")
        if kind == "range":
            if kw:
                raise Unsupported(f"range keywords {kw}")
            self.emit(depth + 1, f"for ({ctype} scorch_i{n} = {lo}; scorch_i{n} {cmp} scorch_end{n}; "
                                 f"scorch_i{n} += {step}) {{")
            self.emit(depth + 2, f"{var} = scorch_i{n};")
            self.block(body, depth + 2)
            self.emit(depth + 1, "}")
        else:
            self.prange(var, ctype, lo, step, kw, body, depth + 1, n)
        self.emit(depth, "}")

    def prange(self, var: str, ctype: str, lo: str, step: str, kw: List[str], body: List[_Line],
               depth: int, n: int) -> None:
        opts = dict(p.split("=", 1) for p in kw)
        opts = {k.strip(): v.strip() for k, v in opts.items()}
        if set(opts) - {"nogil", "schedule", "num_threads"} or opts.get("nogil") != "True":
            raise Unsupported(f"prange options {opts}")
        sched = opts.get("schedule", "'static'").strip("'\"")
        if sched not in ("static", "dynamic", "guided"):
            raise Unsupported(f"schedule {sched!r}")
        if step != "1":
            raise Unsupported("prange with a step")
        for inner in _walk(body):          # locals written in the body would be shared
            target = _split_assign(inner.text)
            names = [target[0]] if target else [inner.text.split(f" {op} ")[0] for op in _AUG
                                                if f" {op} " in inner.text]
            if any(re.fullmatch(r"[A-Za-z_]\w*", x.strip()) for x in names) or \
                    inner.text.startswith(("cdef ", "for ", "return", "break")):
                raise Unsupported("a prange body that writes locals")
        threads = f" num_threads({self.expr(opts['num_threads'])})" if "num_threads" in opts else ""
        self.emit(depth, f"if (scorch_end{n} > {lo}) {{")
        self.out.append(f"#pragma omp parallel for schedule({sched}){threads}")
        self.emit(depth + 1, f"for ({ctype} scorch_i{n} = {lo}; scorch_i{n} < scorch_end{n}; scorch_i{n}++) {{")
        self.emit(depth + 2, f"{ctype} {var} = scorch_i{n};")
        self.block(body, depth + 2)
        self.emit(depth + 1, "}")
        self.emit(depth, "}")

    def text(self) -> str:
        params = ", ".join(f"{t} {n}" for t, n in self.params)
        head = [f"static {self.ret} {self.name}({params}) {{"]
        head += ["    " + d for d in self.decls.values()]
        return "\n".join(head + self.out + ["}", ""])


def _walk(body: List[_Line]):
    for line in body:
        yield line
        yield from _walk(line.body)


def _split_assign(t: str) -> Optional[Tuple[str, str]]:
    """``target = value`` at the top level (not ``==``, ``<=``, ``>=``, ``!=``)."""
    depth = 0
    for i, ch in enumerate(t):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "=" and depth == 0:
            if t[i + 1:i + 2] == "=" or t[i - 1:i] in "=!<>+-*/%&|^":
                continue
            return t[:i].strip(), t[i + 1:].strip()
    return None


# --------------------------------------------------------------------------- module
def to_cpp(source: str) -> str:
    """The C++ extension module for a ``.pyx`` kernel with a ``kernel_c`` entry; raises
    :class:`Unsupported` for anything else."""
    # the capsule line codegen._c_entry prints (its name, codegen.KERNEL_C_CAPSULE, is what
    # the C fast path checks; codegen is not imported here: it pulls in torch), or the
    # result line of codegen._result_entry
    if "\nKERNEL_C = PyCapsule_New(<void*>kernel_c, b\"scorch.kernel_c\", NULL)" in source:
        entry = _C_ENTRY
    elif "\n    return result_to_python(&res)\n" in source:
        entry = _RESULT_ENTRY
    else:
        raise Unsupported("no C entry")
    value_type = re.search(r"^cdef \w+ run_chunk\w*\(Args\* pa, .*?(?:\w+\[)?(\w+)\]?\* oval\)",
                           source, re.M)
    int_values = value_type is None or value_type.group(1) in _INT_VALUE_TYPES
    includes = ["<stdint.h>", "<type_traits>"]
    verbatim: List[str] = []
    typedefs: List[str] = []
    functions: List[str] = []
    struct: List[str] = []
    arg_ptrs: set = set()
    nargs = None
    for node in _tree(source.splitlines()):
        t = node.text
        m = re.fullmatch(r"from\s+([\w.]+)\s+cimport\s+.*", t)
        if m:
            if m.group(1) not in _INCLUDES:
                raise Unsupported(f"cimport from {m.group(1)}")
            inc = _INCLUDES[m.group(1)]
            if inc and inc not in includes:
                includes.append(inc)
        elif t.startswith("import ") or t.startswith("from "):
            raise Unsupported(f"Python import {t!r}")
        elif t == "cdef extern from *:":
            verbatim.extend(_verbatim(node))
        elif t == 'cdef extern from "Python.h":' or t.startswith("KERNEL_C = "):
            continue
        elif t == "cdef struct Args:":
            for f in node.body:
                fm = re.fullmatch(r"(.+?)\s*\b([A-Za-z_]\w*)", f.text)
                if fm is None:
                    raise Unsupported(f"field {f.text!r}")
                ctype = _ctype(fm.group(1))
                struct.append(f"    {ctype} {fm.group(2)};")
                if ctype.endswith("*"):
                    arg_ptrs.add(fm.group(2))
        elif t.startswith("ctypedef "):
            fm = re.fullmatch(r"ctypedef\s+(\w+)\s*\(\*(\w+)\)\((.*)\)\s*(?:noexcept)?\s*(?:nogil)?", t)
            if fm is None:
                raise Unsupported(f"typedef {t!r}")
            params = ", ".join(_ctype(p) for p in _split_top(fm.group(3), ","))
            typedefs.append(f"typedef {_ctype(fm.group(1))} (*{fm.group(2)})({params});")
        elif t.startswith("def kernel(list args, int nthreads, int panel=0):"):
            for inner in node.body:
                vm = re.fullmatch(r"cdef int64_t values\[(\d+)\]", inner.text)
                if vm:
                    nargs = int(vm.group(1))
        elif t.startswith("cdef ") and t.endswith(":"):
            fm = _FUNC.fullmatch(t)
            if fm is None:
                raise Unsupported(f"function {t!r}")
            fn = _Function(_ctype(fm.group(1)), fm.group(2), _params(fm.group(3)), node.body,
                           frozenset(arg_ptrs), int_values, "nogil" in fm.group(4).split())
            functions.append(fn.text())
        else:
            raise Unsupported(f"module statement {t!r}")
    if nargs is None or entry[0] not in "".join(functions):
        raise Unsupported(f"no {entry[0]} and kernel wrapper")
    head = [line for line in source.splitlines() if line.startswith("# ") or line == "#"]
    parts = ["// scorch generated kernel, lowered from its .pyx (scorch/tensor_compiler/cxx_module.py)"]
    parts += ["// " + line[2:] for line in head]
    parts += ["#define PY_SSIZE_T_CLEAN", "#include <Python.h>"]
    parts += [f"#include {inc}" for inc in includes]
    if any(inc.startswith('"') for inc in includes):
        parts.append("using namespace scorch;")
    wrapper = _WRAPPER.replace("@NARGS@", str(nargs)).replace("@CALL@", entry[1]).replace("@INIT@", entry[2])
    parts += [_HELPERS, *verbatim, "struct Args {", *struct, "};", *typedefs, "", *functions,
              *([entry[3]] if entry[3] else []), wrapper]
    return "\n".join(parts) + "\n"


def _verbatim(node: _Line) -> List[str]:
    """The C text of a ``cdef extern from *`` block, dedented to its first line (the
    Cython declarations after it only tell Cython what that text defines)."""
    lines = node.verbatim
    if not lines:      # only renamed functions: NAME "C_NAME"(...)
        out = []
        for decl in node.body:
            m = re.fullmatch(r'[\w\s\*]*?\b(\w+)\s+"(\w+)"\s*\([^()]*\)\s*(?:noexcept\s*)?(?:nogil)?',
                             decl.text)
            if m is None:
                raise Unsupported(f"extern declaration {decl.text!r}")
            out.append(f"#define {m.group(1)} {m.group(2)}")
        return out
    cut = min(len(x) - len(x.lstrip(" ")) for x in lines if x.strip())
    return [x[cut:] for x in lines]


_HELPERS = r"""
template <class A, class B> static inline typename std::common_type<A, B>::type
scorch_min(A a, B b) { return b < a ? b : a; }
template <class A, class B> static inline typename std::common_type<A, B>::type
scorch_max(A a, B b) { return b > a ? b : a; }
"""

_WRAPPER = r"""
/* the Python face: kernel(args, nthreads, panel=0) and the KERNEL_C capsule */
static PyObject* scorch_kernel(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
    if (argc < 2 || argc > 3) {
        PyErr_SetString(PyExc_TypeError, "kernel(args, nthreads, panel=0)");
        return NULL;
    }
    if (!PyList_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "kernel: args must be a list");
        return NULL;
    }
    if (PyList_GET_SIZE(argv[0]) < @NARGS@) {
        PyErr_SetString(PyExc_IndexError, "kernel: args has fewer than @NARGS@ values");
        return NULL;
    }
    int64_t values[@NARGS@ + 1];
    for (Py_ssize_t i = 0; i < @NARGS@; i++) {
        values[i] = (int64_t)PyLong_AsLongLong(PyList_GET_ITEM(argv[0], i));
        if (values[i] == -1 && PyErr_Occurred()) return NULL;
    }
    long nthreads = PyLong_AsLong(argv[1]);
    if (nthreads == -1 && PyErr_Occurred()) return NULL;
    long panel = argc > 2 ? PyLong_AsLong(argv[2]) : 0;
    if (panel == -1 && PyErr_Occurred()) return NULL;
@CALL@
}

static PyMethodDef scorch_methods[] = {
    {"kernel", (PyCFunction)(void (*)(void))scorch_kernel, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};

#define SCORCH_CAT2(a, b) a##b
#define SCORCH_CAT(a, b) SCORCH_CAT2(a, b)
#define SCORCH_STR2(a) #a
#define SCORCH_STR(a) SCORCH_STR2(a)
static struct PyModuleDef scorch_module = {
    PyModuleDef_HEAD_INIT, SCORCH_STR(SCORCH_MODULE), NULL, -1, scorch_methods};

PyMODINIT_FUNC SCORCH_CAT(PyInit_, SCORCH_MODULE)(void) {
    PyObject* m = PyModule_Create(&scorch_module);
    if (m == NULL) return NULL;
@INIT@
    return m;
}
"""

#: (the C entry's signature, the call in ``kernel``, the module's set-up, declarations)
_C_ENTRY = ("static void kernel_c(const int64_t* args, int nthreads, int panel)", """\
    Py_BEGIN_ALLOW_THREADS
    kernel_c(values, (int)nthreads, (int)panel);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;""", """\
    PyObject* cap = PyCapsule_New((void*)kernel_c, "scorch.kernel_c", NULL);
    if (cap == NULL || PyModule_AddObject(m, "KERNEL_C", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }""", "")

#: a kernel that hands its output over: ``scorch._runtime.result`` makes the arrays
_RESULT_ENTRY = (
    "static int kernel_result_c(const int64_t* args, int nthreads, int panel, KernelResult* res)", """\
    KernelResult res;
    result_init(&res);
    Py_BEGIN_ALLOW_THREADS
    kernel_result_c(values, (int)nthreads, (int)panel, &res);
    result_check_allocation(&res);
    Py_END_ALLOW_THREADS
    return scorch_result_to_python(&res);""", """\
    PyObject* runtime = PyImport_ImportModule("scorch._runtime.result");
    PyObject* cap = runtime == NULL ? NULL : PyObject_GetAttrString(runtime, "RESULT_TO_PYTHON");
    Py_XDECREF(runtime);
    scorch_result_to_python = cap == NULL ? NULL
        : (PyObject* (*)(KernelResult*))PyCapsule_GetPointer(cap, "scorch.result_to_python");
    Py_XDECREF(cap);
    if (scorch_result_to_python == NULL) {
        Py_DECREF(m);
        return NULL;
    }""", "static PyObject* (*scorch_result_to_python)(KernelResult*);")
