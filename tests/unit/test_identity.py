"""Code fingerprints: formatting never matters, code always does, no source means no answer."""
import ast
import functools
import glob
import importlib
import importlib.util
import json
import linecache
import os
import py_compile
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tpu_closure_fix import identity

PACKAGE_DIR = os.path.dirname(os.path.abspath(identity.__file__))

# A method in the style of the call sites: decorator, annotations, docstring, comments, an import in
# the body, a conditional rewrite of kwargs, literals of every kind, a call with keywords.
BASE = '''
@override
def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
    """Run the step.

    The closure runs inside.
    """
    import torch_xla.core.xla_model as xm  # imported here, not at module level

    closure = kwargs.get("closure")
    if closure is not None and self.enabled:
        kwargs = {**kwargs, "closure": partial(self._wrap, optimizer, closure)}
    sizes = [1000, 16, 2.5, b"raw"]
    message = f"{closure!r:>10} done"
    return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)
'''

# BASE's docstring, to replace or drop (the rest of BASE is kept as written).
_DOCSTRING = re.compile(r'    """Run the step\..*?"""\n', re.S)

# Each one is BASE written differently; same code.
SAME_CODE = {
    "comments and blank lines": '''
@override
def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:  # type: ignore[override]
    """Run the step.

    The closure runs inside.
    """
    # the import is deferred
    import torch_xla.core.xla_model as xm


    closure = kwargs.get("closure")  # may be None
    if closure is not None and self.enabled:
        # wrap it
        kwargs = {**kwargs, "closure": partial(self._wrap, optimizer, closure)}
    sizes = [1000, 16, 2.5, b"raw"]
    message = f"{closure!r:>10} done"
    return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)  # the bug
''',
    "docstring changed": _DOCSTRING.sub('    """Something else entirely."""\n', BASE).replace("\n\n", "\n"),
    "no docstring": _DOCSTRING.sub("", BASE).replace("\n\n", "\n"),
    "quote style and literal spelling": """
@override
def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
    '''Run the step.'''
    import torch_xla.core.xla_model as xm
    closure = kwargs.get('clo' "sure")
    if closure is not None and self.enabled:
        kwargs = {**kwargs, u'\\x63losure': partial(self._wrap, optimizer, closure)}
    sizes = [1_000, 0x10, 2.50, B'raw']
    message = F'{closure!r:>10} done'
    return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)
""",
    "black-style reflow": '''
@override
def optimizer_step(
    self,
    optimizer: Optimizable,
    **kwargs: Any,
) -> Any:
    """Run the step."""
    import torch_xla.core.xla_model as xm

    closure = kwargs.get(
        "closure",
    )
    if (
        closure is not None
        and self.enabled
    ):
        kwargs = {
            **kwargs,
            "closure": partial(
                self._wrap,
                optimizer,
                closure,
            ),
        }
    sizes = [
        1000,
        16,
        2.5,
        b"raw",
    ]
    message = f"{closure!r:>10} done"
    return (
        xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)
    )
''',
    "one-liners, semicolons, backslashes, 2-space indent": '''
@override
def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
  import torch_xla.core.xla_model as xm; closure = kwargs.get("closure")
  if closure is not None and self.enabled: kwargs = {**kwargs, "closure": partial(self._wrap, optimizer, closure)}
  sizes = [1000, 16, 2.5, b"raw"];
  message = f"{closure!r:>10} done"
  return xm.optimizer_step(optimizer, \\
                           optimizer_args=kwargs, barrier=True)
''',
    # what inspect returns for a method, from a file with Windows line ends
    "indented as a method, CRLF line ends": textwrap.indent(BASE.lstrip("\n"), "    ").replace("\n", "\r\n"),
}

# Each one changes what BASE does (or how it is bound); every one must get another fingerprint.
DIFFERENT_CODE = {
    "renamed local": ("closure = kwargs.get(\"closure\")\n    if closure is not None",
                      "clos = kwargs.get(\"closure\")\n    if clos is not None"),
    "renamed method": ("def optimizer_step(", "def optimizer_steps("),
    "renamed parameter": ("**kwargs: Any) -> Any", "**kw: Any) -> Any"),
    "annotation changed": ("optimizer: Optimizable", "optimizer: Optimizer"),
    "constant changed": ("barrier=True", "barrier=False"),
    "string changed": ('kwargs.get("closure")', 'kwargs.get("closures")'),
    "number changed": ("[1000, 16", "[1000, 17"),
    "int became float": ("[1000, 16", "[1000.0, 16"),
    "bytes became str": ('b"raw"', '"raw"'),
    "f-string became plain string": ('f"{closure!r:>10} done"', '"{closure!r:>10} done"'),
    "f-string format spec changed": ('f"{closure!r:>10} done"', 'f"{closure!r:>11} done"'),
    "operator changed": ("closure is not None and", "closure is not None or"),
    "comparison changed": ("closure is not None", "closure is None"),
    "argument removed": ("optimizer_args=kwargs, barrier=True", "optimizer_args=kwargs"),
    "argument added": ("partial(self._wrap, optimizer, closure)", "partial(self._wrap, optimizer, closure, 1)"),
    "arguments swapped": ("partial(self._wrap, optimizer, closure)", "partial(self._wrap, closure, optimizer)"),
    "decorator removed": ("@override\n", ""),
    "decorator changed": ("@override\n", "@torch.no_grad()\n"),
    "statements swapped": ('    sizes = [1000, 16, 2.5, b"raw"]\n    message = f"{closure!r:>10} done"\n',
                           '    message = f"{closure!r:>10} done"\n    sizes = [1000, 16, 2.5, b"raw"]\n'),
    "statement moved out of the if block": (
        '        kwargs = {**kwargs, "closure": partial(self._wrap, optimizer, closure)}\n',
        '    kwargs = {**kwargs, "closure": partial(self._wrap, optimizer, closure)}\n'),
    "line boundary moved (bare return, then a call)": (
        "    return xm.optimizer_step(", "    return\n    xm.optimizer_step("),
    "parentheses changing precedence": ('sizes = [1000, 16, 2.5, b"raw"]', "sizes = (a + b) * c"),
    "call added": ("    sizes =", "    print()\n    sizes ="),
}
DIFFERENT_PAIRS = {
    # (a, b): equal tokens up to the construct under test, different meaning.
    "1-tuple vs parenthesized value": ("x = (a,)", "x = (a)"),
    "1-tuple subscript vs plain subscript": ("y = x[i,]", "y = x[i]"),
    "slice tuple vs slice": ("y = x[1:2,]", "y = x[1:2]"),
    "precedence": ("y = (a + b) * c", "y = a + b * c"),
    "assert on a tuple vs assert with message": ('assert (x, "m")', 'assert x, "m"'),
    "f-string statement runs code, a plain string does not": ('f"{run()}"', '"{run()}"'),
    "empty tuple vs nothing": ("return ()", "return"),
    "generator vs list": ("x = (a for a in b)", "x = [a for a in b]"),
    "with on a tuple vs two context managers": ("with (a, b): pass", "with a, b: pass"),
    "tuple vs its first element in a for loop": ("for x in (a, b): pass", "for x in a: pass"),
    "conditional expression vs its first part": ("y = (a) if b else c", "y = a"),
    # Soft keywords are keywords there: "(1,)" after "case" is a 1-tuple pattern, not a call's arguments.
    "case pattern 1-tuple vs parenthesized value": ("match x:\n        case (1,): pass",
                                                    "match x:\n        case (1): pass"),
    "match subject tuple vs value": ("match (x,):\n        case _: pass", "match (x):\n        case _: pass"),
}
SAME_PAIRS = {
    # (a, b): statement-level spellings that mean the same.
    "redundant parentheses around a value": ("x = (a + b)", "x = a + b"),
    "redundant parentheses around a return value": ("return (a.b(c))", "return a.b(c)"),
    "tuple parentheses in an assignment": ("x, y = (a, b)", "x, y = a, b"),
    "for target parentheses": ("for (a, b) in (pairs): pass", "for a, b in pairs: pass"),
    "condition parentheses": ("while (x > 1): x -= 1", "while x > 1:\n        x -= 1"),
    "trailing comma in a 2-tuple": ("x = (a, b,)", "x = a, b"),
    "trailing comma in a dict, set and list": ("x = [{a: 1,}, {b,}, [c,],]", "x = [{a: 1}, {b}, [c]]"),
    "trailing comma in a 2-element subscript": ("y = x[a, b,]", "y = x[a, b]"),
    "nested redundant parentheses": ("x = ((a))", "x = a"),
    "parenthesized string statement": ('("a" "b")', '"another no-op"'),
    "raw and escaped spelling": (r'x = r"\d+"', 'x = "\\\\d+"'),
    "string escapes": ('x = "\\x41\\u0042"', 'x = "AB"'),
}


def _fp(source):
    return identity.fingerprint_source(textwrap.dedent(source))


def _wrap_statement(statement):
    return "def f(a, b, c, x, i, pairs):\n    %s\n" % statement


def test_fingerprint_format():
    value = _fp(BASE)
    assert value.startswith("sha256:") and len(value) == len("sha256:") + 16
    int(value[len("sha256:"):], 16)


@pytest.mark.parametrize("name", sorted(SAME_CODE))
def test_formatting_does_not_change_the_fingerprint(name):
    assert _fp(SAME_CODE[name]) == _fp(BASE), identity.normalized_tokens(textwrap.dedent(SAME_CODE[name]))


@pytest.mark.parametrize("name", sorted(DIFFERENT_CODE))
def test_any_code_change_changes_the_fingerprint(name):
    old, new = DIFFERENT_CODE[name]
    assert BASE.count(old) == 1, "the edit must apply exactly once"
    assert _fp(BASE.replace(old, new)) != _fp(BASE)


@pytest.mark.parametrize("name", sorted(DIFFERENT_PAIRS))
def test_constructs_that_look_alike_stay_apart(name):
    first, second = DIFFERENT_PAIRS[name]
    if first.startswith("match ") and sys.version_info < (3, 10):
        pytest.skip("match statements parse on Python >= 3.10 only (no code that runs here has one)")
    assert _fp(_wrap_statement(first)) != _fp(_wrap_statement(second))


@pytest.mark.parametrize("name", sorted(SAME_PAIRS))
def test_equivalent_spellings_share_a_fingerprint(name):
    first, second = SAME_PAIRS[name]
    assert _fp(_wrap_statement(first)) == _fp(_wrap_statement(second))


def test_a_dropped_docstring_leaves_an_empty_body_not_a_pass():
    # Removing the no-op statement must not make the body look like some other body.
    assert _fp('def f():\n    "doc"\n') != _fp("def f():\n    pass\n")
    assert _fp('def f():\n    "doc"\n') == _fp("def f():\n    '''other doc'''\n")


def test_nesting_depth_is_part_of_the_stream():
    inside = "def f(a):\n    if a:\n        g()\n        h()\n"
    outside = "def f(a):\n    if a:\n        g()\n    h()\n"
    assert _fp(inside) != _fp(outside)
    assert identity.normalized_tokens(inside).count("L2") == 2
    assert identity.normalized_tokens(outside).count("L2") == 1


def test_token_stream_is_read_from_source_text_only():
    # The same list on every Python: 3.12+ splits f-strings into parts, which are joined back.
    source = "def f(x, *, y=lambda a, b: a):\n    return f'{x!r:>{y}}' + 'z'\n"
    assert identity.normalized_tokens(source) == [
        "L0", "Ndef", "Nf", "O(", "Nx", "O,", "O*", "O,", "Ny", "O=", "Nlambda", "Na", "O,", "Nb", "O:", "Na",
        "O)", "O:",
        "L1", "Nreturn", "Ff:'{x!r:>{y}}'", "O+", "S's:z'",
    ]


def test_format_number_is_hashed():
    before = _fp(BASE)
    original = identity.FORMAT
    identity.FORMAT = original + 1
    try:
        assert _fp(BASE) != before
    finally:
        identity.FORMAT = original


@pytest.mark.parametrize("source", ["x = 1\n", "class C:\n    pass\n", "lambda: 1\n", "def (:\n", '"""text\n'])
def test_text_that_is_not_one_definition_is_refused(source):
    with pytest.raises(ValueError):
        identity.fingerprint_source(source)


# --------------------------------------------------------------------------- live functions

def sample(a, b=2, *rest, key=None, **extra):
    """A module-level function with source on disk."""
    return a + b


def _decorator(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


@_decorator
def decorated(x):
    return x * 2


class Holder(object):
    def method(self, value):
        return value

    @staticmethod
    def static(value):
        return value

    @classmethod
    def klass(cls, value):
        return value


def _source_of(function):
    return textwrap.dedent(__import__("inspect").getsource(function))


def test_fingerprint_of_a_live_function_is_that_of_its_source():
    assert identity.fingerprint(sample) == identity.fingerprint_source(_source_of(sample))
    assert identity.examine(sample) == (identity.fingerprint(sample), "")


def test_wrappers_are_looked_through():
    inner = decorated.__wrapped__
    assert identity.fingerprint(decorated) == identity.fingerprint_source(_source_of(inner))
    assert identity.fingerprint(Holder().method) == identity.fingerprint(Holder.method)
    assert identity.fingerprint(vars(Holder)["static"]) == identity.fingerprint_source(
        _source_of(Holder.static))
    assert identity.fingerprint(vars(Holder)["klass"]) == identity.fingerprint(Holder.klass) is not None


def test_a_wrapt_wrapper_is_looked_through():
    import wrapt  # a runtime dependency of the package

    @wrapt.decorator
    def passthrough(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    wrapped = passthrough(sample)
    assert wrapped is not sample
    assert identity.fingerprint(wrapped) == identity.fingerprint(sample) is not None


@pytest.mark.parametrize("function", [len, dict.get, object.__init__, functools.partial(sample, 1)],
                         ids=["builtin", "C method", "slot wrapper", "partial"])
def test_no_code_object_means_no_fingerprint(function):
    assert identity.examine(function) == (None, identity.NO_SOURCE)
    assert identity.match(function, {"1.0": identity.fingerprint(sample)}).text == "cannot tell: no source"


def test_code_compiled_from_a_string_has_no_source():
    namespace = {}
    exec(compile("def made(a):\n    return a\n", "<generated tpu_closure_fix test>", "exec"), namespace)
    assert identity.fingerprint(namespace["made"]) is None
    assert identity.describe_match(namespace["made"], {"2.6.6": _fp("def made(a):\n    return a\n")}) \
        == "cannot tell: no source"


def _import_fresh(name, folder):
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def test_a_pyc_only_module_has_no_source(tmp_path):
    name = "tpu_closure_fix_identity_pyc_only"
    source = tmp_path / (name + ".py")
    source.write_text("def step(optimizer):\n    return optimizer\n")
    py_compile.compile(str(source), cfile=str(tmp_path / (name + ".pyc")), doraise=True)
    source.unlink()
    try:
        module = _import_fresh(name, tmp_path)
        assert module.__spec__.loader.__class__.__name__ == "SourcelessFileLoader"
        assert identity.examine(module.step) == (None, identity.NO_SOURCE)
    finally:
        sys.modules.pop(name, None)


def test_source_changed_on_disk_after_import_is_not_trusted(tmp_path):
    name = "tpu_closure_fix_identity_stale"
    path = tmp_path / (name + ".py")
    path.write_text("def step(optimizer, closure):\n    return optimizer.apply(closure)\n")
    try:
        module = _import_fresh(name, tmp_path)
        assert identity.fingerprint(module.step) is not None
        cases = {
            "renamed": "def other(optimizer, closure):\n    return optimizer.apply(closure)\n",
            "parameters": "def step(optimizer):\n    return optimizer.apply()\n",
            "names": "def step(optimizer, closure):\n    return optimizer.run(closure)\n",
        }
        for label, text in cases.items():
            path.write_text(text)
            os.utime(str(path), (1, 1 + len(label)))  # a new mtime/size, so linecache rereads the file
            linecache.checkcache(str(path))
            found = identity.examine(module.step)
            assert found.value is None and "does not match the loaded code" in found.reason, (label, found)
    finally:
        sys.modules.pop(name, None)


# Code whose bytecode refers to names in ways the source does not spell plainly: 3.8 compiles
# ``assert`` to a lookup of AssertionError, private names are mangled, ``import a.b`` refers to "a.b".
LIVE_MODULE = """
import os.path


class Plugin(object):
    __slots__ = ("__state",)

    def check(self, x):
        assert x, "message"
        return x

    def private(self):
        self.__state = os.path.join("a", "b")
        return self.__state

    def nested(self, items):
        import json.decoder as decoder
        return [decoder.JSONDecoder for _ in items if _], {k: v for k, v in items}, f"{items!r:>{len(items)}}"

    async def waits(self, other):
        async with other as value:
            return await value

    def uses_super(self):
        return super().__init__()
"""


def test_live_code_on_disk_gets_a_fingerprint_equal_to_its_source(tmp_path):
    # Imported from a plain file: the test module's own functions are rewritten by pytest's assert hook,
    # and rewritten code rightly does not match its source.
    name = "tpu_closure_fix_identity_live"
    (tmp_path / (name + ".py")).write_text(LIVE_MODULE)
    try:
        module = _import_fresh(name, tmp_path)
        for attribute in ("check", "private", "nested", "waits", "uses_super"):
            function = getattr(module.Plugin, attribute)
            assert identity.examine(function) == (identity.fingerprint_source(_source_of(function)), ""), attribute
    finally:
        sys.modules.pop(name, None)


def test_code_rewritten_by_an_import_hook_does_not_match_its_source():
    def asserts(x):
        assert x  # pytest rewrites this assert into code that refers to @py_assert names
        return x
    found = identity.examine(asserts)
    assert found.value is None and "does not match the loaded code" in found.reason, found


# --------------------------------------------------------------------------- matching

def test_match_names_the_newest_identical_release():
    mine = identity.fingerprint(sample)
    other = _fp("def sample(a):\n    return a\n")
    known = {"2.1.0": mine, "2.6.6": mine, "2.6.10": other, "2.5.0": mine, "2.0.0": None}
    found = identity.match(sample, known)
    assert found == (mine, "2.6.6", "code identical to 2.6.6")
    assert identity.describe_match(sample, list(known.items())) == "code identical to 2.6.6"


def test_match_lists_what_was_compared_when_the_code_differs():
    other = _fp("def sample(a):\n    return a\n")
    found = identity.match(sample, {"2.6.6": other, "2.1.0": other, "1.0": None})
    assert found.release is None and found.fingerprint == identity.fingerprint(sample)
    assert found.text == "code differs from 2.1.0, 2.6.6"
    assert identity.match(sample, {"1.0": None}).text == "cannot tell: no known release has a fingerprint"
    many = {"2.%d.0" % minor: other for minor in (10, 1, 2, 3)}
    assert identity.match(sample, many).text == "code differs from all 4 known releases (2.1.0 .. 2.10.0)"


def test_release_order():
    releases = ["2.0.0", "1.10.0", "2.0.0rc1", "1.8.3.post1", "1.8.3", "1.9", "2.0.0.dev1", "2.0.0.post1"]
    assert sorted(releases, key=identity.release_key) == [
        "1.8.3", "1.8.3.post1", "1.9", "1.10.0", "2.0.0.dev1", "2.0.0rc1", "2.0.0", "2.0.0.post1"]
    assert identity.release_key("1.9.0") == identity.release_key("1.9")


# --------------------------------------------------------------------------- other Python versions

def _other_pythons():
    """Interpreters 3.8+ on this machine other than the running one, one per minor version: pyenv's
    installed versions and ``python3.N`` on PATH (pyenv's shims excluded: they fail for versions that
    are not selected). Found by file name only; the test runs them."""
    running = "%d.%d" % sys.version_info[:2]
    found = {}
    for path in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3"))):
        version = ".".join(path.split(os.sep)[-3].split(".")[:2])
        found.setdefault(version, path)
    for minor in range(8, 16):
        path = shutil.which("python3.%d" % minor)
        if path and os.sep + "shims" + os.sep not in path:
            found.setdefault("3.%d" % minor, path)
    return {version: path for version, path in found.items()
            if version != running and tuple(map(int, version.split("."))) >= (3, 8)}


def _corpus():
    """Every sample above plus every function definition in this package's source."""
    sources = [textwrap.dedent(BASE)] + [textwrap.dedent(text) for text in SAME_CODE.values()]
    sources += [_wrap_statement(statement) for pair in list(DIFFERENT_PAIRS.values()) + list(SAME_PAIRS.values())
                for statement in pair if not statement.startswith("match ")]  # 3.10+ syntax: 3.8 cannot read it
    for path in sorted(glob.glob(os.path.join(PACKAGE_DIR, "*.py"))):
        with open(path) as handle:
            text = handle.read()
        lines = text.splitlines(True)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                sources.append("".join(lines[first - 1:node.end_lineno]))
    return sources


_CROSS = r"""
import importlib, importlib.util, inspect, json, sys, textwrap
spec = importlib.util.spec_from_file_location("identity_under_test", sys.argv[1])
identity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(identity)
sys.path.insert(0, sys.argv[2])
live = importlib.import_module(sys.argv[3]).Plugin
print(json.dumps({
    "sources": [identity.fingerprint_source(text) for text in json.load(sys.stdin)],
    "live": {name: [identity.examine(getattr(live, name)),
                    identity.fingerprint_source(textwrap.dedent(inspect.getsource(getattr(live, name))))]
             for name in sorted(vars(live)) if inspect.isfunction(vars(live)[name])},
}))
"""

OTHER_PYTHONS = _other_pythons()

if OTHER_PYTHONS:  # defined only where another interpreter exists to compare with
    def test_same_fingerprints_under_every_python_version(tmp_path):
        if hasattr(identity, "MutantDict"):
            pytest.skip("identity.py is mutmut's rewritten copy (scripts/mutation.sh): other interpreters "
                        "cannot import mutmut")
        corpus = _corpus()
        assert len(corpus) > 100
        here = [identity.fingerprint_source(text) for text in corpus]
        name = "tpu_closure_fix_identity_live_cross"
        (tmp_path / (name + ".py")).write_text(LIVE_MODULE)
        try:
            local = _import_fresh(name, tmp_path).Plugin
        finally:
            sys.modules.pop(name, None)
        for version, python in sorted(OTHER_PYTHONS.items()):
            proc = subprocess.run([python, "-c", _CROSS, identity.__file__, str(tmp_path), name],
                                  input=json.dumps(corpus), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=300)
            assert proc.returncode == 0, (version, python, proc.stderr)
            there = json.loads(proc.stdout)
            differing = [text for text, a, b in zip(corpus, here, there["sources"]) if a != b]
            assert not differing, (version, differing[:3])
            # Live functions (3.8 compiles assert differently, 3.11+ inline differently...) still match
            # their source there, and give the fingerprint the source gives here.
            assert len(there["live"]) == 5
            for function, (examined, from_source) in there["live"].items():
                assert examined == [from_source, ""], (version, function, examined)
                assert from_source == identity.fingerprint(getattr(local, function)), (version, function)


# --------------------------------------------------------------------------- scripts/fingerprints.py

def _script():
    path = os.path.join(os.path.dirname(PACKAGE_DIR), "scripts", "fingerprints.py")
    spec = importlib.util.spec_from_file_location("fingerprints_script_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULE_WITH_REDEFINITION = '''
import torch


class XLAPrecision(Precision):
    def optimizer_step(self, optimizer):
        return "replaced below"

    if torch.__version__:
        @override
        def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
            import torch_xla.core.xla_model as xm
            return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)

    def other(self):
        pass
'''


def test_script_locates_the_definition_that_wins_with_its_decorators():
    segment = _script().definition_source(MODULE_WITH_REDEFINITION, "XLAPrecision.optimizer_step")
    assert segment.lstrip().startswith("@override") and "barrier=True" in segment and "other" not in segment
    assert _script().definition_source(MODULE_WITH_REDEFINITION, "XLAPrecision.missing") is None
    assert _script().definition_source(MODULE_WITH_REDEFINITION, "Nowhere.optimizer_step") is None


def test_script_reads_wheels_without_installing_them(tmp_path):
    import zipfile

    from tpu_closure_fix import sites

    row = next(site for site in sites.CALL_SITES
               if site.fix is not None and site.module == "lightning_fabric.plugins.precision.xla")
    wheel = tmp_path / "lightning_fabric-2.6.6-py3-none-any.whl"
    with zipfile.ZipFile(str(wheel), "w") as archive:
        archive.writestr("lightning_fabric/plugins/precision/xla.py", MODULE_WITH_REDEFINITION)
    outside = tmp_path / "lightning_fabric-1.0.0-py3-none-any.whl"  # outside every row's range: not reported
    with zipfile.ZipFile(str(outside), "w") as archive:
        archive.writestr("lightning_fabric/plugins/precision/xla.py", MODULE_WITH_REDEFINITION)
    measured = _script().measure_wheels([str(tmp_path)])
    expected = identity.fingerprint_source(
        _script().definition_source(MODULE_WITH_REDEFINITION, "XLAPrecision.optimizer_step"))
    assert measured.values == {row.variant: {"2.6.6": expected}} and not measured.problems


def test_script_comparison_reports_differences_and_missing_records():
    script = _script()
    measured = {"fabric-2.1": {"2.1.0": "sha256:a", "2.6.6": "sha256:b", "2.2.0": None},
                "pl-1.8": {"1.8.6": "sha256:c"}}
    recorded = {"fabric-2.1": {"2.1.0": "sha256:a", "2.6.6": "sha256:x", "2.4.0": "sha256:y"}}
    assert script.compare(measured, recorded) == [
        "fabric-2.1 2.6.6: measured sha256:b, recorded sha256:x",
        "pl-1.8 1.8.6: measured sha256:c, not recorded",
    ]
    assert script.compare({"fabric-2.1": {"2.1.0": "sha256:a"}}, recorded) == []


def test_script_flags_two_copies_of_one_release_that_disagree():
    measurements = _script().Measurements()
    measurements.add("fabric-2.1", "2.6.6", "sha256:a", "target lightning-fabric==2.6.6 (import)")
    measurements.add("fabric-2.1", "2.6.6", "sha256:a", "target pytorch-lightning==2.6.6 (import)")
    assert measurements.problems == []
    measurements.add("fabric-2.1", "2.6.6", "sha256:b", "wheel x.whl")
    assert len(measurements.problems) == 1 and "sha256:b from wheel x.whl" in measurements.problems[0]
    measurements.add("pl-1.8", "1.8.6", None, "target t", "no source")
    assert "no fingerprint (no source)" in measurements.problems[-1]


def test_script_check_compares_with_the_table_field(monkeypatch):
    script = _script()
    rows = [{"variant": "fabric-2.1", "package": "lightning_fabric", "module": "m", "qualname": "C.f",
             "releases": ">=2.1.0,<2.6.7", "recorded": {"2.1.0": "sha256:a", "2.6.6": "sha256:b"}},
            {"variant": "pl-1.8", "package": "pytorch_lightning", "module": "n", "qualname": "C.f",
             "releases": ">=1.8.0,<1.9.0", "recorded": {}}]
    measured = script.Measurements()
    measured.add("fabric-2.1", "2.6.6", "sha256:b", "target x (import)")
    measured.add("fabric-2.1", "2.3.0", "sha256:a", "target z (import)")  # same code as 2.1.0: no problem
    measured.add("pl-1.8", "1.8.6", "sha256:c", "target y (import)")
    calls = []
    monkeypatch.setattr(script, "table_rows", lambda: rows)
    monkeypatch.setattr(script, "installed_targets", lambda names, root: calls.append(names) or ["x", "y"])
    monkeypatch.setattr(script, "measure_targets", lambda names, root, rows_: measured)
    assert script.check(["x", "y"]) == ["pl-1.8 1.8.6: measured sha256:c, not among the row's recorded (none)"]
    assert script.check(["x"], recorded={"fabric-2.1": {"2.6.6": "sha256:z", "2.3.0": "sha256:a"},
                                         "pl-1.8": {"1.8.6": "sha256:c"}}) \
        == ["fabric-2.1 2.6.6: measured sha256:b, recorded sha256:z"]
    assert calls == [["x", "y"], ["x"]]
    for row in rows:
        row["recorded"] = {}
    assert "records no fingerprints" in script.check(["x"])[0]


# --------------------------------------------------------------------------- what decorators are bound to
#: A decorator that wraps (``functools.wraps``): text that decorators_known must not take for a no-op.
WRAPPING = """
def wrapping(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper
"""

DECORATED = """
import functools
from typing_extensions import override as real_override
""" + WRAPPING + """
def marking(function):  # a no-op the shim does not know: not on the short list
    return function

override = {binding}

class Precision:
    @override
    def optimizer_step(self, optimizer, **kwargs):
        return optimizer.step(**kwargs)

    @staticmethod
    def helper(x):
        return x
"""


def _decorated(tmp_path, binding, name="h4_decorated"):
    path = tmp_path / ("%s_%s.py" % (name, abs(hash(binding))))
    path.write_text(DECORATED.format(binding=binding))
    spec = importlib.util.spec_from_file_location(path.stem, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[path.stem]
    return module.Precision


@pytest.mark.parametrize("binding, known", [("real_override", True), ("wrapping", False), ("marking", False)])
def test_identity_needs_each_decorator_bound_to_a_known_no_op(tmp_path, binding, known):
    """Same text, same fingerprint; only what ``override`` is bound to differs, and decides identity."""
    cls = _decorated(tmp_path, binding)
    assert identity.fingerprint(vars(cls)["optimizer_step"]) == identity.fingerprint(
        vars(_decorated(tmp_path, "real_override", "h4_reference"))["optimizer_step"])
    assert identity.decorators_known(vars(cls)["optimizer_step"]) is known


def test_a_static_method_is_known_only_as_a_static_method(tmp_path):
    cls = _decorated(tmp_path, "real_override")
    assert identity.decorators_known(vars(cls)["helper"]) is True
    assert identity.decorators_known(vars(cls)["helper"].__func__) is False  # the class holds a staticmethod


def test_a_decorator_call_or_a_wrapper_without_source_decorators_is_not_known():
    @functools.lru_cache()
    def cached(x):
        return x

    def plain(x):
        return x

    assert identity.decorators_known(cached) is False  # not a plain function
    assert identity.decorators_known(plain) is True  # no decorator at all
    assert identity.decorators_known(functools.wraps(plain)(lambda x: x)) is False  # a wrapper (__wrapped__)
