"""C declarations, token by token, for tools/gen/cuda_api.py: a tokenizer,
and the macros and top-level declarations of a preprocessed header
(`cc -E -dD` output), each with where it came from.

Standard library only; Python 3.9+.
"""
import re

KEYWORDS = set("""
auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while _Bool _Complex _Alignas _Alignof _Atomic _Static_assert
_Noreturn _Thread_local __attribute__ __attribute __extension__ __inline__ __inline __restrict
__restrict__ __const__ __const __volatile__ __signed__ __typeof__ typeof __asm__ asm
__builtin_offsetof __builtin_va_list __int128 _Float16 __fp16
""".split())
TAG_KEYWORDS = ("struct", "union", "enum")

TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>L?"(?:\\.|[^"\\])*"|L?'(?:\\.|[^'\\])*')
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.])*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<punct>\.\.\.|<<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||\#\#|[-+*/%&|^!~<>=?:;,.(){}\[\]\#\\@$`])
""", re.X | re.S)
IDENT_RE = re.compile(r"[A-Za-z_]\w*$")


def tokenize(text):
    out, pos = [], 0
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if not m:
            raise ValueError("tools/gen/cuda_api.py: cannot tokenize near %r" % text[pos:pos + 40])
        pos = m.end()
        if m.lastgroup != "ws":
            out.append(m.group())
    return out


def is_ident(tok):
    return bool(IDENT_RE.match(tok))


def strip_c_comments_and_strings(text):
    """C source with comments, string and char literals blanked (identifiers
    named only there are no roots)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                  " ", text, flags=re.S)


# ---------------------------------------------------------------------------
# The preprocessed headers, as macros and top-level declarations
# ---------------------------------------------------------------------------

class Macro:
    def __init__(self, name, params, body, origin, order):
        self.name, self.params, self.body, self.origin, self.order = name, params, body, origin, order
        self.tokens = tokenize(body)
        self.refs = {t for t in self.tokens if is_ident(t)} - set(params or ())

    def text(self):
        params = "(%s)" % ", ".join(self.params) if self.params is not None else ""
        return ("#define %s%s %s" % (self.name, params, self.body)).rstrip()


def group_end(tokens, i):
    """Index just past the bracket group opening at tokens[i]."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[tokens[i]]]
    j = i + 1
    while stack:
        t = tokens[j]
        if t in pairs:
            stack.append(pairs[t])
        elif t == stack[-1]:
            stack.pop()
        j += 1
    return j


def split_top(tokens, sep):
    """tokens split at `sep` outside any bracket group."""
    parts, cur, i = [], [], 0
    while i < len(tokens):
        t = tokens[i]
        if t in "([{":
            j = group_end(tokens, i)
            cur.extend(tokens[i:j])
            i = j
            continue
        if t == sep:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
        i += 1
    if cur:
        parts.append(cur)
    return parts


def skip_attributes(tokens):
    """tokens without their __attribute__((...)) groups."""
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] in ("__attribute__", "__attribute") and i + 1 < len(tokens) and tokens[i + 1] == "(":
            i = group_end(tokens, i + 1)
            continue
        out.append(tokens[i])
        i += 1
    return out


class Decl:
    """One top-level declaration (or definition) of the preprocessed headers."""

    def __init__(self, tokens, origin, order):
        self.tokens, self.origin, self.order = tokens, origin, order
        self.names = set()        # ordinary identifiers it declares
        self.tags = set()         # struct/union/enum tags it defines (with a body)
        self.enums = []           # [(start, end, [(name, value)])]: token span of each enum body
        self.typedefs = {}        # typedef name -> its declarator tokens
        self.aggregates = []      # [(keyword, tag or None, body tokens, typedef names)]
        self.kind = "other"
        self._analyse()

    # -- what it declares --------------------------------------------------
    def _analyse(self):
        toks = self.tokens
        self.is_typedef = "typedef" in toks[:2]
        i = 0
        while i < len(toks):
            if toks[i] in TAG_KEYWORDS:
                kw, j = toks[i], i + 1
                while j < len(toks) and toks[j] in ("__attribute__", "__attribute"):
                    j = group_end(toks, j + 1)
                tag = None
                if j < len(toks) and is_ident(toks[j]) and toks[j] not in KEYWORDS:
                    tag, j = toks[j], j + 1
                if j < len(toks) and toks[j] == "{":
                    end = group_end(toks, j)
                    if tag:
                        self.tags.add(tag)
                    if kw == "enum":
                        self.enums.append((j, end, self._enumerators(toks[j + 1:end - 1])))
                    self.aggregates.append((kw, tag, toks[j + 1:end - 1], []))
                    i = end
                    continue
            i += 1
        for _, _, items in self.enums:
            self.names.update(n for n, _ in items)
        collapsed = self._collapse_bodies(toks)
        if self.is_typedef:
            self.kind = "typedef"
            decls = split_top(collapsed[:-1] if collapsed[-1:] == [";"] else collapsed, ",")
            for k, d in enumerate(decls):
                name = self._declarator_name(d if k else d[1:])
                if name:
                    self.names.add(name)
                    self.typedefs[name] = d
            if self.aggregates and decls:
                # typedef struct {...} A, *B: the aggregate is named by the
                # declarators without a '*' or '[' of their own.
                self.aggregates[0][3].extend(
                    n for n, d in self.typedefs.items()
                    if "*" not in skip_attributes(d) and "[" not in d)
        elif any(t == "(" for t in collapsed):
            name = self._function_name(collapsed)
            if name:
                self.kind = "function"
                self.names.add(name)
        elif self.aggregates and collapsed[-2:] in (["}", ";"], ["{}", ";"]):
            self.kind = "aggregate"

    @staticmethod
    def _collapse_bodies(toks):
        out, i = [], 0
        while i < len(toks):
            if toks[i] == "{":
                i = group_end(toks, i)
                out.append("{}")
                continue
            out.append(toks[i])
            i += 1
        return out

    @staticmethod
    def _declarator_name(d):
        d = skip_attributes(d)
        for i, t in enumerate(d):                         # (*name)(...) or (CUPTIAPI *name)
            if t == "(" and "*" in d[i + 1:group_end(d, i)]:
                inner = [x for x in d[i + 1:group_end(d, i) - 1] if is_ident(x) and x not in KEYWORDS]
                return inner[-1] if inner else None
        names, i = [], 0
        while i < len(d):
            t = d[i]
            if t in ("[", "("):
                i = group_end(d, i)
                continue
            if t in TAG_KEYWORDS:
                i += 2 if i + 1 < len(d) and is_ident(d[i + 1]) and d[i + 1] != "{}" else 1
                continue
            if is_ident(t) and t not in KEYWORDS:
                names.append(t)
            i += 1
        return names[-1] if names else None

    @staticmethod
    def _function_name(collapsed):
        d = skip_attributes(collapsed)
        for i, t in enumerate(d):
            if t == "(" and i > 0 and is_ident(d[i - 1]) and d[i - 1] not in KEYWORDS:
                return d[i - 1]
        return None

    @staticmethod
    def _enumerators(body):
        """[(name, value tokens or None)] of an enum body."""
        out = []
        for item in split_top(body, ","):
            item = skip_attributes(item)
            if not item:
                continue
            value = item[2:] if len(item) > 1 and item[1] == "=" else None
            out.append((item[0], value))
        return out

    # -- what it needs ------------------------------------------------------
    def refs(self):
        """Identifiers and tags ('tag:X') this declaration names, its enum
        bodies left out (their values are written out as numbers)."""
        skip = set()
        for start, end, _ in self.enums:
            skip.update(range(start, end))
        out, toks = set(), self.tokens
        for i, t in enumerate(toks):
            if i in skip or not is_ident(t) or t in KEYWORDS:
                continue
            if i > 0 and toks[i - 1] in TAG_KEYWORDS:
                out.add("tag:" + t)
            else:
                out.add(t)
        return out - self.names - {"tag:" + t for t in self.tags}


def parse_preprocessed(text, is_cuda):
    """(macros {name: Macro}, decls [Decl]) of `cc -E -dD` output;
    is_cuda(path) says which files are CUDA's."""
    macros, decls = {}, []
    origin = ""
    pending, depth, order = [], 0, 0
    line_re = re.compile(r'#\s*(\d+)\s+"([^"]*)"')
    define_re = re.compile(r"#\s*define\s+([A-Za-z_]\w*)(\(([^)]*)\))?\s*(.*)$")
    body_kinds = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            m = line_re.match(s)
            if m:
                origin = m.group(2)
                continue
            m = define_re.match(s)
            if m and is_cuda(origin):
                params = None
                if m.group(2) is not None:
                    params = [p.strip() for p in m.group(3).split(",") if p.strip()]
                order += 1
                macros[m.group(1)] = Macro(m.group(1), params, m.group(4).strip(), origin, order)
            elif s.startswith("#undef") and is_cuda(origin):
                macros.pop(s.split()[1], None)
            continue                                    # #pragma, built-in defines
        for tok in tokenize(line):
            if not pending:
                pending_origin = origin
            pending.append(tok)
            if tok == "{":
                body_kinds.append("function" if depth == 0 and _opens_function(pending[:-1])
                                  else "block")
            if tok in "([{":
                depth += 1
            elif tok in ")]}":
                depth -= 1
            if tok == "}" and body_kinds.pop() == "function" and depth == 0:
                tok = ";"                                # a definition ends at its brace
            if tok == ";" and depth == 0:
                order += 1
                if is_cuda(pending_origin):
                    decls.append(Decl(pending, pending_origin, order))
                pending = []
    return macros, decls


def _opens_function(before):
    """True if a '{' after these tokens opens a function body."""
    d = skip_attributes(before)
    if not d or d[0] == "typedef" or "=" in d:
        return False
    if d[-1] != ")":
        return False
    k = len(d) - 1                    # find the '(' matching the last ')'
    level = 0
    while k >= 0:
        level += d[k] == ")"
        level -= d[k] == "("
        if level == 0:
            break
        k -= 1
    return k > 0 and is_ident(d[k - 1]) and d[k - 1] not in KEYWORDS
