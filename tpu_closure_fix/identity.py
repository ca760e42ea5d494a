"""Code identity: does a function hold the same code as a known release's?

A *fingerprint* is a short hash of a function definition's normalized source
tokens. Two definitions that differ only in formatting get the same fingerprint;
any change to what the code does gets a different one. It lets a release beyond a
call-site row's range be recognized as "the same code as release X", which was
checked.

What is hashed: the whole definition as written in the source file, decorators,
``def`` line (name, parameters, annotations, defaults) and body, as a stream of
tokens with the logical-line boundaries and the block nesting depth of each line.

What is normalized away (none of it changes what the code does):

* comments (type comments included), blank lines, indentation width, line
  breaks inside brackets and backslash continuations;
* string literals: compared by value, so quote style, prefix case, ``u``, raw vs
  escaped spelling and implicit concatenation (``"a" "b"`` == ``"ab"``) do not
  matter. f-strings are compared by their text between the quotes (prefix case
  and quote characters aside);
* numbers: compared by type and value (``1_000`` == ``1000``, ``0XFF`` == ``255``);
* docstrings, and any other statement made only of plain string literals (a no-op;
  f-strings are kept, since their expressions run);
* ``;`` and one-line compound statements: ``if x: return y`` is the same as the
  two-line block, and so is a one-line ``case`` body (``case 1: return y``);
* a trailing comma before a closing bracket, where it cannot change the value:
  always in calls, definitions, class bases, list, dict and set displays; in a
  parenthesized tuple or a subscript only when another comma remains, because
  ``(x,)`` is a 1-tuple and ``x[i,]`` indexes with a tuple;
* parentheses around a whole statement-level expression (an assignment's right
  or left side, ``return``/``del``, an ``if``/``elif``/``while`` condition, a
  ``for`` target or iterable), the "invisible parentheses" formatters add when
  they split a long line. ``assert`` and ``with`` are excluded (parentheses make
  a tuple there), and so is ``()``, the empty tuple.

Decorators are kept, deliberately. A decorator runs when the class is built and
can replace the method by something else; a fix written for the undecorated code
would then bypass it. A release that adds a no-op marker such as ``@override``
therefore gets a new fingerprint: the cost is only a "code differs" answer,
never a wrong "identical". Text alone cannot tell what a decorator name is bound
to, so identity (as the engine uses it) also requires :func:`decorators_known`:
each decorator resolves, at run time, to a known no-op (``typing_extensions.override``,
``typing.override``) or to ``staticmethod``/``classmethod``; a name bound to a
wrapping decorator makes the code "not identical". The function's own name is kept too, so a fingerprint
identifies one definition and is never shared by two methods with equal bodies.

Guarantees and limits:

* The fingerprint is computed from source text, never from bytecode, so it does
  not depend on the Python version running it (3.8 to 3.13 were compared; 3.12+
  tokenizes f-strings into parts, which are joined back to the 3.8 form).
* No source, no fingerprint: a ``.pyc``-only or zipped-without-source install, a
  builtin, a C function or code compiled from a string gives ``None`` ("cannot
  tell"), never a guess. So does source whose ``def`` name, parameters or
  referenced names do not match the loaded code object (the file changed on
  disk after import, or an import hook rewrote the code, as pytest does with
  ``assert``).
* Soft keywords (``match``, ``case``, ``type``, the ``_`` wildcard) acting as
  keywords are told from names with ``ast``, so ``case (1,):`` and ``case (1):``
  differ.
* Equal fingerprints mean equal token streams after the rules above (up to a
  64-bit hash collision). Formatting changes those rules do not cover give a
  different fingerprint: redundant parentheses elsewhere than listed, a
  docstring replaced by ``pass``, reordered keyword arguments. Differences are
  always safe to report; they only mean "not recognized".
* Source using syntax newer than the running Python's tokenizer (3.12's nested
  same-quote f-strings on 3.11) cannot be fingerprinted there; such code cannot
  run there either.
* The function is unwrapped first (``__wrapped__``, ``__func__``), so a wrapper
  installed by this shim or by ``functools.wraps`` is looked through.

Standard library only; the heavy modules (inspect, tokenize, ast, hashlib) are
imported on first use.
"""
from collections import namedtuple
import re

#: Bumped whenever the normalization changes; it is hashed into every fingerprint,
#: so a table recorded under an older format no longer matches (and ``--check``
#: of scripts/fingerprints.py says so) instead of matching by accident.
FORMAT = 1
PREFIX = "sha256:"
_DIGITS = 16  # 64 bits of the SHA-256: plenty to tell a handful of releases apart

#: ``examine()`` result: ``value`` is the fingerprint or None; ``reason`` says why it is None.
Fingerprint = namedtuple("Fingerprint", "value reason")
#: ``match()`` result: ``release`` is the newest known release with the same code, or None;
#: ``text`` is a short phrase for reports ("code identical to 2.6.6", "cannot tell: no source").
Match = namedtuple("Match", "fingerprint release text")

NO_SOURCE = "no source"

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}
_AUGMENTED = frozenset(("+=", "-=", "*=", "/=", "//=", "%=", "@=", "&=", "|=", "^=", ">>=", "<<=", "**="))
_COMPOUND = frozenset(("if", "elif", "else", "for", "while", "try", "except", "finally", "with", "def", "class"))
# Statement keywords after which the rest of the line is one whole expression.
_WHOLE_EXPRESSION_AFTER = frozenset(("return", "del"))
_CONDITION_HEADERS = frozenset(("if", "elif", "while"))
# Names a code object may refer to without the source spelling them: 3.8 compiles
# ``assert`` to a global lookup of AssertionError.
_IMPLICIT_NAMES = frozenset(("AssertionError",))
_STRING_PREFIX = re.compile(r"^([A-Za-z]*)('''|\"\"\"|'|\")")


class _Token(namedtuple("_Token", "kind text")):
    """One normalized token. ``kind``: N name, K soft keyword acting as a keyword, O operator,
    D number, S plain string (``text`` is its value), F f-string (``text`` = (prefix, body))."""

    def serialized(self):
        if self.kind == "S":
            return "S" + ascii(self.text)
        if self.kind == "F":
            return "F%s:%s" % (self.text[0], ascii(self.text[1]))
        return self.kind + ascii(self.text)[1:-1]


# --------------------------------------------------------------------------- public API


def fingerprint(function):
    """Fingerprint (``"sha256:<16 hex>"``) of ``function``'s definition, or None
    when its source is not available or does not match the loaded code."""
    return examine(function).value


def examine(function):
    """:class:`Fingerprint` (value, reason) of ``function``; ``reason`` is "" when
    ``value`` is set, else why not (``"no source"`` and the like)."""
    try:
        function = _unwrap(function)
        code = getattr(function, "__code__", None)
    except Exception:  # an exotic object: nothing to read
        code = None
    if code is None or not hasattr(code, "co_name"):
        return Fingerprint(None, NO_SOURCE)
    source = _source_text(function)
    if source is None:
        return Fingerprint(None, NO_SOURCE)
    try:
        lines = _normalized_lines(source)
        mismatch = _mismatch_with_code(source, lines, code)
    except ValueError as exc:
        return Fingerprint(None, "source does not parse as a definition: %s" % (exc,))
    except Exception as exc:  # a normalization bug on odd code is "cannot tell", never a crash
        return Fingerprint(None, "could not fingerprint the source (%s: %s)" % (type(exc).__name__, exc))
    if mismatch:
        return Fingerprint(None, "source on disk does not match the loaded code (%s)" % mismatch)
    return Fingerprint(_hash(lines), "")


#: Decorators known to leave a definition's behaviour as written: (module, name) of the object the
#: decorator expression must resolve to. ``override`` only sets ``__override__`` and returns the
#: function; ``staticmethod``/``classmethod`` are spelled in the fingerprinted text, so code with
#: them matches only a known release that had them.
KNOWN_DECORATORS = (("typing_extensions", "override"), ("typing", "override"),
                    ("builtins", "staticmethod"), ("builtins", "classmethod"))


def decorators_known(function):
    """True when every decorator of ``function``'s definition resolves, now, to an object of
    :data:`KNOWN_DECORATORS` and the attribute holds exactly what those decorators return.

    A fingerprint is computed from text: ``@override`` bound to a wrapping decorator has the same
    text as the no-op. So identity also needs each decorator expression (a name or a dotted name;
    anything else, a call included, is not known) looked up where the definition runs -- the
    namespace of the class body that defines it (not those of the classes around it), then the
    module globals, then builtins -- to be one of the known
    objects, and the attribute to be the plain function (or a static/class method around it).
    Limits: a name rebound after the class was built is judged by its binding now.
    """
    import types

    inner = getattr(function, "__func__", function) if isinstance(function, (staticmethod, classmethod)) \
        else function
    if type(inner) is not types.FunctionType or getattr(inner, "__wrapped__", None) is not None:
        return False
    source = _source_text(inner)
    if source is None:
        return False
    try:
        expressions = _decorator_expressions(source)
    except (SyntaxError, ValueError):
        return False
    names = [_dotted(expression) for expression in expressions]
    if any(name is None for name in names):
        return False
    known = _known_decorator_objects()
    resolved = [_lookup(inner, name) for name in names]
    if not all(any(obj is candidate for candidate in known) for obj in resolved):
        return False
    # What the decorators return must be what the class holds: the function itself under
    # ``override``, a static/class method object under exactly one of those.
    wrapping = [obj for obj in resolved if obj is staticmethod or obj is classmethod]
    if len(wrapping) > 1:
        return False
    return type(function) is (wrapping[0] if wrapping else types.FunctionType)


def _decorator_expressions(source):
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(source))
    definition = tree.body[0]
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError("not a function definition")
    return definition.decorator_list


def _dotted(expression):
    """("a", "b", "c") for the expression ``a.b.c``; None for anything else."""
    import ast

    parts = []
    while isinstance(expression, ast.Attribute):
        parts.append(expression.attr)
        expression = expression.value
    if not isinstance(expression, ast.Name):
        return None
    return tuple([expression.id] + parts[::-1])


def _known_decorator_objects():
    import sys

    found = []
    for module_name, name in KNOWN_DECORATORS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, name):
            found.append(getattr(module, name))
    return found


def _lookup(function, dotted):
    """The object ``dotted`` names where ``function``'s decorators ran: the body of the class that
    defines it, then globals, then builtins, as Python resolves a name there (the bodies of the classes
    around that class are not visible from inside it); attributes only through modules. None when it
    cannot be read."""
    import builtins
    import types

    first, namespaces = dotted[0], []
    scope = function.__globals__
    for part in function.__qualname__.split(".")[:-1]:  # the enclosing classes, outermost first
        if part == "<locals>":
            return None  # a class defined in a function: its body's names are gone
        scope = vars(scope).get(part) if isinstance(scope, type) else scope.get(part)
        if not isinstance(scope, type):
            return None
        namespaces = [vars(scope)]  # only the innermost class body binds names for the definition
    namespaces += [function.__globals__, vars(builtins)]
    value = next((namespace[first] for namespace in namespaces if first in namespace), None)
    for attribute in dotted[1:]:
        if not isinstance(value, types.ModuleType):
            return None
        value = vars(value).get(attribute)
    return value


def fingerprint_source(source):
    """Fingerprint of the definition in ``source`` (text from the first decorator
    or ``def`` to the end of the body; may be indented). Raises ValueError when
    the text is not one function definition."""
    return _hash(_normalized_lines(source))


def normalized_tokens(source):
    """The token stream that :func:`fingerprint_source` hashes, one string per
    token; each logical line starts with ``"L<depth>"``. For tests and debugging."""
    return _serialize(_normalized_lines(source))


def match(function, known):
    """Compare ``function`` with ``known`` ({release: fingerprint}, or pairs).

    Returns :class:`Match`. ``release`` is the newest known release whose
    fingerprint equals the function's, else None. Known entries whose
    fingerprint is None (code that could not be read) never match."""
    found = examine(function)
    if found.value is None:
        return Match(None, None, "cannot tell: %s" % found.reason)
    return match_fingerprint(found.value, known)


def match_fingerprint(value, known):
    """:func:`match` for an already computed fingerprint ``value``."""
    pairs = list(known.items()) if hasattr(known, "items") else list(known)
    same = [release for release, recorded in pairs if recorded is not None and recorded == value]
    if same:
        newest = max(same, key=release_key)
        return Match(value, newest, "code identical to %s" % newest)
    compared = sorted((release for release, recorded in pairs if recorded is not None), key=release_key)
    if not compared:
        return Match(value, None, "cannot tell: no known release has a fingerprint")
    if len(compared) > 3:  # a short phrase for reports; the full list is in the table
        return Match(value, None, "code differs from all %d known releases (%s .. %s)"
                     % (len(compared), compared[0], compared[-1]))
    return Match(value, None, "code differs from %s" % ", ".join(compared))


def describe_match(function, known):
    """Short report phrase: "code identical to 2.6.6", "code differs from 2.1.0,
    2.6.6" (more than three: "code differs from all 31 known releases (2.1.0 ..
    2.6.6)") or "cannot tell: no source"."""
    return match(function, known).text


def release_key(release):
    """Sort key for release strings (PEP 440 order for N.N.N[{a,b,rc}N][.postN][.devN];
    anything else sorts first, by text)."""
    found = re.match(r"^v?(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?$", str(release).strip())
    if not found:
        return (0, (), (), -1, (), str(release))
    numbers, pre_kind, pre_number, post, dev = found.groups()
    parts = [int(part) for part in numbers.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    if pre_kind:
        pre = (0, ("a", "b", "rc").index(pre_kind), int(pre_number))
    elif dev is not None and post is None:
        pre = (-1,)  # 1.0.dev1 comes before 1.0a1
    else:
        pre = (1,)
    dev_key = (0, int(dev)) if dev is not None else (1,)
    return (1, tuple(parts), pre, int(post) if post is not None else -1, dev_key, "")


# --------------------------------------------------------------------------- source


def _unwrap(function):
    """The innermost plain function behind wrappers, bound methods, static- and
    class-methods (at most a bounded number of hops; a cycle stops the walk)."""
    seen = set()
    for _ in range(100):
        if id(function) in seen:
            break
        seen.add(id(function))
        inner = None
        for attribute in ("__wrapped__", "__func__"):
            try:
                inner = getattr(function, attribute, None)
            except Exception:  # an exotic proxy whose attribute access fails
                inner = None
            if inner is not None:
                break
        if inner is None:
            break
        function = inner
    return function


def _source_text(function):
    """The definition's source as ``inspect`` finds it (from the first decorator
    to the end of the body), or None."""
    import inspect

    try:
        lines, _ = inspect.getsourcelines(function)
    except (OSError, TypeError, IndexError, SyntaxError):
        return None
    except Exception:  # inspect's block finder on odd files: no source, not a crash
        return None
    text = "".join(lines)
    return text if text.strip() else None


def _mismatch_with_code(source, lines, code):
    """Why the source text cannot be the source of ``code`` (an empty string when
    it can). Checks the ``def`` name, the parameter names, and that every name the
    code object refers to appears in the text."""
    header = next(tokens for _, tokens in lines if tokens[0].text in ("def", "async"))
    names = [token.text for token in header]
    def_name = names[names.index("def") + 1]
    if def_name != code.co_name:
        return "defines %s, the code is %s" % (def_name, code.co_name)
    if sorted(_parameter_names(header)) != sorted(_code_parameters(code)):
        return "parameters differ"
    words = set(re.findall(r"[^\W\d]\w*", source))
    for name in code.co_names:
        for part in name.split("."):  # "import a.b.c" refers to "a.b.c"
            if part and part not in words and _unmangled(part) not in words and part not in _IMPLICIT_NAMES:
                return "the code refers to %s" % part
    return ""


def _unmangled(name):
    """``_Class__attr`` -> ``__attr`` (private names are mangled in bytecode)."""
    if name.startswith("_") and "__" in name[1:]:
        return name[name.index("__", 1):]
    return name


def _code_parameters(code):
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # CO_VARARGS, CO_VARKEYWORDS
    return list(code.co_varnames[:count])


def _parameter_names(header):
    """Parameter names in a normalized ``def`` line: names at the parameter list's
    top level that start a parameter (a lambda's parameters in a default value
    are skipped)."""
    start = [token.text for token in header].index("(")
    names, depth, in_lambda = [], 0, False
    for index in range(start, len(header)):
        token = header[index]
        depth += _depth_change(token)
        if depth == 0:
            break
        if depth != 1 or (token.kind == "O" and token.text in _OPENERS):
            continue
        if _is(token, "N", "lambda"):
            in_lambda = True
        elif in_lambda:
            in_lambda = not _is(token, "O", ":")
        elif token.kind == "N" and _is(header[index - 1], "O", "(", ",", "*", "**") \
                and _is(header[index + 1], "O", ":", "=", ",", ")"):
            names.append(token.text)
    return names


# --------------------------------------------------------------------------- normalization


def _hash(lines):
    import hashlib

    payload = "tpu-closure-fix fingerprint format %d\n%s" % (FORMAT, "\n".join(_serialize(lines)))
    return PREFIX + hashlib.sha256(payload.encode("ascii")).hexdigest()[:_DIGITS]


def _serialize(lines):
    out = []
    for depth, tokens in lines:
        out.append("L%d" % depth)
        out.extend(token.serialized() for token in tokens)
    return out


def _normalized_lines(source):
    """[(depth, [_Token...]), ...]: the definition's logical lines after every
    normalization rule, depth relative to the first line."""
    lines = _logical_lines(_raw_tokens(source))
    lines = _split_statements(lines)
    lines = [(depth, _remove_whole_parentheses(_remove_trailing_commas(tokens))) for depth, tokens in lines]
    lines = [(depth, tokens) for depth, tokens in lines if not _is_string_statement(tokens)]
    _require_definition(lines)
    return lines


def _raw_tokens(source):
    """Tokenize; yield _Token objects and ("LINE", depth) markers; merge adjacent
    plain strings; join 3.12+ f-string parts back into one token."""
    import io
    import tokenize

    if not source.endswith("\n"):
        source += "\n"
    text_lines = io.StringIO(source).readlines()  # the rows tokenize counts (str.splitlines splits on more)
    fstring_start = {getattr(tokenize, name) for name in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, name)}
    fstring_end = {getattr(tokenize, name) for name in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, name)}
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    out, state = [], {"depth": 0, "started": False, "line_open": False}

    def emit(token):
        if not state["line_open"]:
            out.append(("LINE", state["depth"]))
            state["line_open"] = True
        out.append(token)

    nesting, fstring_from = 0, None
    soft, pattern_starts = _soft_keyword_positions(source)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in fstring_start:
                if nesting == 0:
                    fstring_from = tok.start
                nesting += 1
            elif nesting:
                if tok.type in fstring_end:
                    nesting -= 1
                    if nesting == 0:
                        emit(_string_token(_slice(text_lines, fstring_from, tok.end)))
            elif tok.type in skip:
                continue
            elif tok.type == tokenize.INDENT:
                state["depth"] += state["started"]  # an indented first line (a method) is depth 0
            elif tok.type == tokenize.DEDENT:
                state["depth"] -= 1
            elif tok.type == tokenize.NEWLINE:
                out.append(("NEWLINE", None))
                state["line_open"] = False
            else:
                if not state["started"]:
                    state["started"], state["depth"] = True, 0
                if tok.start in pattern_starts and isinstance(out[-1], _Token) and _is(out[-1], "N", "case"):
                    out[-1] = _Token("K", "case")  # the token before a case pattern is the soft keyword
                emit(_Token("K", tok.string) if tok.start in soft else _token(tok, tokenize))
    except (tokenize.TokenError, SyntaxError) as exc:  # IndentationError is a SyntaxError
        raise ValueError("does not tokenize: %s" % (exc,))
    return _merge_strings(out)


#: Soft keywords (``match``, ``case``, ``type``, the ``_`` wildcard) are names to the tokenizer; where
#: they act as keywords they become "K" tokens, so ``case (1,):`` (a 1-tuple pattern) and ``case (1):``
#: are never made equal by the rules for names (a trailing comma after a name's bracket is noise).
_SOFT_KEYWORDS = ("match", "case", "type", "_")


def _soft_keyword_positions(source):
    """((row, col) of soft keywords acting as keywords, (row, col) where case patterns start), read
    with ``ast`` (tokens alone cannot tell ``match[x]: int`` from ``match [x]:``). Source that names no
    soft keyword needs no parse. Raises ValueError when one is named and the text does not parse."""
    import ast
    import re
    import textwrap

    if not re.search(r"\b(match|case|type|_)\b", source):
        return frozenset(), frozenset()
    dedented = textwrap.dedent(source)
    margins = {len(line) - len(dedented_line) for line, dedented_line
               in zip(source.splitlines(), dedented.splitlines()) if dedented_line.strip()}
    margin = margins.pop() if len(margins) == 1 else 0
    try:
        tree = ast.parse(dedented)
    except SyntaxError as exc:
        raise ValueError("does not parse: %s" % (exc,))
    soft, patterns = set(), set()
    for node in ast.walk(tree):
        kind = type(node).__name__
        if kind in ("Match", "TypeAlias"):
            soft.add((node.lineno, node.col_offset + margin))
        elif kind == "match_case":
            patterns.add((node.pattern.lineno, node.pattern.col_offset + margin))
        elif kind == "MatchAs" and node.pattern is None and node.name is None:
            soft.add((node.lineno, node.col_offset + margin))  # the wildcard "_"
    return frozenset(soft), frozenset(patterns)


def _slice(text_lines, start, end):
    (first_row, first_col), (last_row, last_col) = start, end
    if first_row == last_row:
        return text_lines[first_row - 1][first_col:last_col]
    parts = [text_lines[first_row - 1][first_col:]] + text_lines[first_row:last_row - 1]
    return "".join(parts + [text_lines[last_row - 1][:last_col]])


def _token(tok, tokenize):
    if tok.type == tokenize.NAME:
        return _Token("N", _identifier(tok.string))
    if tok.type == tokenize.NUMBER:
        return _Token("D", _number(tok.string))
    if tok.type == tokenize.STRING:
        return _string_token(tok.string)
    if tok.type == tokenize.OP:
        return _Token("O", tok.string)
    raise ValueError("unexpected token %r" % (tok.string,))


def _identifier(name):
    if name.isascii():
        return name
    import unicodedata

    return unicodedata.normalize("NFKC", name)  # what the parser does with identifiers


def _number(text):
    import ast

    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.lower()
    return "%s:%r" % (type(value).__name__, value)


def _string_token(text):
    prefix_match = _STRING_PREFIX.match(text)
    if prefix_match is None:
        raise ValueError("not a string literal: %r" % (text,))
    prefix, quote = prefix_match.group(1).lower(), prefix_match.group(2)
    body = text[len(prefix_match.group(0)):len(text) - len(quote)]
    if "f" in prefix or "t" in prefix:
        return _Token("F", ("".join(sorted(prefix.replace("u", ""))), body))
    return _Token("S", _string_value(prefix, body, text))


def _string_value(prefix, body, text):
    """The literal's value; bytes are kept apart from str (tagged)."""
    if "\\" in body and "r" not in prefix:
        import ast
        import warnings

        with warnings.catch_warnings():  # "\d": DeprecationWarning/SyntaxWarning, not our business
            warnings.simplefilter("ignore")
            value = ast.literal_eval(text)
    else:
        value = body  # no escapes to process: the text between the quotes is the value
    if "b" in prefix:
        return "b:" + (value.decode("latin-1") if isinstance(value, bytes) else value)
    return "s:" + value


def _merge_strings(items):
    """Adjacent plain string literals are one literal (``"a" "b"`` == ``"ab"``)."""
    merged = []
    for item in items:
        if isinstance(item, _Token) and item.kind == "S" and merged and isinstance(merged[-1], _Token) \
                and merged[-1].kind == "S" and merged[-1].text[:2] == item.text[:2]:
            merged[-1] = _Token("S", merged[-1].text + item.text[2:])
        else:
            merged.append(item)
    return merged


def _logical_lines(items):
    lines = []
    for item in items:
        if isinstance(item, tuple) and item[0] == "LINE":
            lines.append((item[1], []))
        elif isinstance(item, _Token):
            lines[-1][1].append(item)
    return [(depth, tokens) for depth, tokens in lines if tokens]


def _split_statements(lines):
    """``a; b`` -> two lines; ``if x: y`` -> header line plus a body line one level deeper."""
    out = []
    for depth, tokens in lines:
        colon = _block_colon(tokens)
        if colon is not None and colon + 1 < len(tokens):
            out.append((depth, tokens[:colon + 1]))
            out.extend((depth + 1, part) for part in _split_semicolons(tokens[colon + 1:]))
        else:
            out.extend((depth, part) for part in _split_semicolons(tokens))
    return out


def _split_semicolons(tokens):
    parts, current, depth = [], [], 0
    for token in tokens:
        depth += _depth_change(token)
        if depth == 0 and token.kind == "O" and token.text == ";":
            parts.append(current)
            current = []
        else:
            current.append(token)
    parts.append(current)
    return [part for part in parts if part]


def _depth_change(token):
    if token.kind != "O":
        return 0
    return 1 if token.text in _OPENERS else -1 if token.text in _CLOSERS else 0


def _block_colon(tokens):
    """Index of the ``:`` ending a compound statement's header, or None."""
    first = 1 if tokens[0].kind == "N" and tokens[0].text == "async" and len(tokens) > 1 else 0
    head = tokens[first]
    if not (_is(head, "N", *_COMPOUND) or _is(head, "K", "match", "case")):
        return None
    depth, lambdas = 0, 0
    for index, token in enumerate(tokens):
        if token.kind == "N" and token.text == "lambda" and depth == 0:
            lambdas += 1
        depth += _depth_change(token)
        if depth == 0 and token.kind == "O" and token.text == ":":
            if lambdas:
                lambdas -= 1
            else:
                return index
    return None


def _matching(tokens):
    """{index of an opening or closing bracket: index of its partner}."""
    pairs, stack = {}, []
    for index, token in enumerate(tokens):
        if token.kind != "O":
            continue
        if token.text in _OPENERS:
            stack.append(index)
        elif token.text in _CLOSERS and stack:
            opening = stack.pop()
            pairs[opening], pairs[index] = index, opening
    return pairs


def _is(token, kind, *texts):
    return token.kind == kind and (not texts or token.text in texts)


def _whole_expression_spans(tokens):
    """(start, end) spans (end exclusive) that each hold one whole statement-level
    expression: where parentheses around the entire span are redundant."""
    first = 1 if _is(tokens[0], "N", "async") and len(tokens) > 1 else 0
    head = tokens[first]
    colon = _block_colon(tokens)
    if _is(head, "N", *_CONDITION_HEADERS) and colon is not None:
        return [(first + 1, colon)]
    if _is(head, "N", "for") and colon is not None:
        depth = 0
        for index in range(first + 1, colon):
            depth += _depth_change(tokens[index])
            if depth == 0 and _is(tokens[index], "N", "in"):
                return [(first + 1, index), (index + 1, colon)]
        return []
    if _is(head, "N", *_WHOLE_EXPRESSION_AFTER):
        return [(first + 1, len(tokens))]
    if head.kind == "N" and _is_keyword(head.text) and head.text not in ("await", "not", "lambda", "yield"):
        return []  # assert, with, raise, import, ... : not an expression statement
    spans, start, depth = [], 0, 0
    for index, token in enumerate(tokens):  # assignment targets and values, split at "=", "+=" ...
        depth += _depth_change(token)
        if depth == 0 and token.kind == "O" and (token.text == "=" or token.text in _AUGMENTED):
            spans.append((start, index))
            start = index + 1
    spans.append((start, len(tokens)))
    return spans


def _remove_whole_parentheses(tokens):
    while True:
        pairs = _matching(tokens)
        drop = set()
        for start, end in _whole_expression_spans(tokens):
            # Not "()": the empty tuple is a value. Anything else inside is one whole expression
            # (a tuple, a generator expression...); without the parentheses it either means the
            # same or is not valid Python, so no other definition can produce the same tokens.
            if end - start > 2 and _is(tokens[start], "O", "(") and pairs.get(start) == end - 1:
                drop.update((start, end - 1))
        if not drop:
            return tokens
        tokens = [token for index, token in enumerate(tokens) if index not in drop]


def _remove_trailing_commas(tokens):
    pairs = _matching(tokens)
    drop = set()
    for index in range(len(tokens) - 1):
        closing = tokens[index + 1]
        if _is(tokens[index], "O", ",") and closing.kind == "O" and closing.text in _CLOSERS \
                and (index + 1) in pairs and _trailing_comma_is_noise(tokens, pairs[index + 1], index):
            drop.add(index)
    return [token for index, token in enumerate(tokens) if index not in drop]


def _trailing_comma_is_noise(tokens, opening, comma):
    bracket = tokens[opening].text
    if bracket == "{":
        return True
    follows_value = opening > 0 and _ends_a_value(tokens[opening - 1])
    if bracket == "(" and follows_value:
        return True  # a call, a def's parameters, class bases
    if bracket == "[" and not follows_value:
        return True  # a list display
    # A parenthesized tuple or a subscript: "(x,)" is a 1-tuple, "x[i,]" indexes with (i,).
    return _top_level_commas(tokens, opening, comma) > 1


def _ends_a_value(token):
    if token.kind in ("S", "F", "D"):
        return True
    if token.kind == "N":
        return not _is_keyword(token.text) or token.text in ("None", "True", "False")
    return token.kind == "O" and token.text in _CLOSERS


def _top_level_commas(tokens, opening, closing):
    count, depth = 0, 0
    for index in range(opening + 1, closing + 1):
        token = tokens[index]
        if depth == 0 and _is(token, "O", ","):
            count += 1
        depth += _depth_change(token)
    return count


def _is_keyword(name):
    import keyword

    return keyword.iskeyword(name)


def _is_string_statement(tokens):
    """A statement made only of plain string literals: a docstring or a no-op."""
    return len(tokens) == 1 and tokens[0].kind == "S"


def _require_definition(lines):
    for _, tokens in lines:
        if _is(tokens[0], "O", "@"):
            continue
        first = 1 if _is(tokens[0], "N", "async") and len(tokens) > 1 else 0
        if _is(tokens[first], "N", "def") and len(tokens) > first + 2 and tokens[first + 1].kind == "N":
            return
        break
    raise ValueError("not a function definition")
