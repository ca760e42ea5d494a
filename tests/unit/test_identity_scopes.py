"""tpu_closure_fix.identity: which class body binds a method's decorators, parameter names of
odd signatures, the reasons ``examine`` gives, unwrapping, and normalization rules probed with pairs of
sources that must fingerprint equal (same code) or differ (different code).

Live functions are imported from module files written for the test (the test module's own functions
are rewritten by pytest's assert hook and rightly have no matching source).
"""
import linecache
import sys
import textwrap
import types

import pytest

from support.module_files import module_from  # noqa: F401  (a fixture)
from tpu_closure_fix import identity


def _fp(source):
    return identity.fingerprint_source(textwrap.dedent(source))


def _statement(statement):
    return _fp("def f(a, b, c, d, g, i, s, x, y):\n    %s\n" % statement.replace("\n", "\n    "))


# --------------------------------------------------------------------------- scopes of decorator names
NESTED_CLASSES = """
import typing_extensions


def override(function):  # registers the function somewhere: not a known no-op
    return function


class Outer:
    override = typing_extensions.override  # visible in Outer's body only

    class Inner:
        @override  # Inner's body cannot see Outer's names: this is the module's override
        def step(self):
            return 1

    @override  # here it is Outer's own binding, the known no-op
    def outer_step(self):
        return 2
"""


def test_an_outer_class_body_does_not_bind_a_nested_class_s_decorators(module_from):
    """Python resolves a name in a class body in that body, then globals and builtins, never in the
    bodies of the classes around it: ``@override`` in ``Inner`` is the module-level function."""
    module = module_from("h5_identity_nested_classes", NESTED_CLASSES)
    assert module.Outer.Inner.step.__qualname__ == "Outer.Inner.step"
    assert identity.decorators_known(vars(module.Outer.Inner)["step"]) is False
    assert identity.decorators_known(vars(module.Outer)["outer_step"]) is True


# --------------------------------------------------------------------------- parameter names
SIGNATURES = """
def annotated(a: int, *args: str, b: "text" = 1, **kwargs: float) -> int:
    return a


def lambda_default(a=lambda x, y: x + y, b=2):
    return a(b, b)


def lambda_star(a=lambda *rest: rest, b=(1, 2), c={"k": [3]}):
    return a, b, c
"""


@pytest.mark.parametrize("name", ["annotated", "lambda_default", "lambda_star"])
def test_parameter_names_of_odd_signatures_match_the_code(module_from, name):
    """Annotated parameters, and the parameters of a lambda in a default value (not the function's):
    the source matches its code, so there is a fingerprint."""
    module = module_from("h5_identity_signatures", SIGNATURES)
    found = identity.examine(getattr(module, name))
    assert found.reason == ""
    assert found.value.startswith(identity.PREFIX)


@pytest.mark.parametrize("header, names", [
    ("def f(a: int, *args: str, b: 'x' = 1, **kw: float) -> int:", ["a", "args", "b", "kw"]),
    ("def f(a=lambda x, y: x + y, b=2):", ["a", "b"]),
    ("def f(a=lambda *rest: rest, b=(1, 2)):", ["a", "b"]),
    ("def f(a=[x for x in y], *, b):", ["a", "b"]),
])
def test_parameter_names_read_from_a_header(header, names):
    tokens = identity._normalized_lines(header + "\n    pass\n")[0][1]
    assert identity._parameter_names(tokens) == names


# --------------------------------------------------------------------------- examine's reasons
NOT_A_FUNCTION = """
step = lambda x: x


class Pretender:
    __code__ = "not a code object"
"""


def test_source_that_is_not_a_definition_is_said_so(module_from):
    module = module_from("h5_identity_not_a_function", NOT_A_FUNCTION)
    assert identity.examine(module.step) == (None, "source does not parse as a definition: not a function definition")


def test_an_object_whose_code_is_no_code_object_has_no_source(module_from):
    """A class has source but a ``__code__`` without ``co_name`` is not a function's code: "no source"."""
    module = module_from("h5_identity_pretender", NOT_A_FUNCTION)
    assert identity.examine(module.Pretender) == (None, identity.NO_SOURCE)


def test_a_failure_inside_normalization_is_cannot_tell(module_from, monkeypatch):
    module = module_from("h5_identity_failure", SIGNATURES)

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(identity, "_mismatch_with_code", broken)
    assert identity.examine(module.annotated) == (None, "could not fingerprint the source (RuntimeError: boom)")


def test_a_mangled_looking_name_is_not_taken_for_another(module_from):
    """Only ``_Class__name`` is a mangled ``__name``: code referring to ``a__b`` does not match a text
    that only spells ``__b``."""
    original = "class Holder:\n    def step(self):\n        return self.a__b\n"
    module = module_from("h5_identity_mangled", original)
    function = module.Holder.step
    assert identity.examine(function).reason == ""
    with open(module.__file__, "w") as handle:
        handle.write(original.replace("self.a__b", "self.__b"))
    linecache.checkcache(module.__file__)
    assert identity.examine(function) == (None, "source on disk does not match the loaded code (the code refers "
                                                "to a__b)")


# --------------------------------------------------------------------------- unwrapping
UNWRAP = """
def plain(a):
    return a
"""


class _Wrapper(object):
    def __init__(self, inner):
        self.__wrapped__ = inner


def test_a_cycle_of_wrappers_back_to_the_function_stops_at_it(module_from):
    module = module_from("h5_identity_unwrap_cycle", UNWRAP)
    function = module.plain
    second = _Wrapper(None)
    first = _Wrapper(second)
    second.__wrapped__ = function
    function.__wrapped__ = first  # plain -> first -> second -> plain
    try:
        assert identity._unwrap(function) is function
        assert identity._unwrap(first) is first
    finally:
        del function.__wrapped__


def test_a_chain_of_wrappers_is_followed_a_bounded_number_of_hops(module_from):
    module = module_from("h5_identity_unwrap_chain", UNWRAP)
    chain = module.plain
    for _ in range(100):
        chain = _Wrapper(chain)
    assert identity.examine(chain).value == identity.fingerprint(module.plain) is not None
    assert identity.examine(_Wrapper(chain)) == (None, identity.NO_SOURCE)  # 101 hops: not walked to the end


def test_an_object_with_only_func_is_looked_through(module_from):
    """Like a static method on Python 3.8/3.9, which has ``__func__`` but no ``__wrapped__``."""
    module = module_from("h5_identity_unwrap_func", UNWRAP)
    holder = types.SimpleNamespace(__func__=module.plain)
    assert identity.examine(holder) == (identity.fingerprint(module.plain), "")


def test_a_wrapper_whose_attribute_access_fails_is_where_unwrapping_stops():
    class Proxy(object):
        @property
        def __wrapped__(self):
            raise RuntimeError("no")

    proxy = Proxy()
    assert identity._unwrap(proxy) is proxy


# --------------------------------------------------------------------------- token stream and errors
def test_a_source_without_a_final_newline_is_the_same_definition():
    assert identity.fingerprint_source("def f(x):\n    return x") == identity.fingerprint_source(
        "def f(x):\n    return x\n")


@pytest.mark.parametrize("source, message", [
    ("def f():\n    return (1\n", r"^does not tokenize: "),
    pytest.param("def f():\n    return $\n", r"^unexpected token ", marks=pytest.mark.skipif(
        sys.version_info >= (3, 12), reason="Python 3.12+'s tokenizer passes '$' on without an error token")),
    ("def f(match):\n    return (match\n", r"^does not parse: "),
    ("-x\ndef f():\n    return 1\n", r"^not a function definition$"),
    ("def f\n", r"^not a function definition$"),
])
def test_text_that_is_not_one_definition_raises_value_error(source, message):
    with pytest.raises(ValueError, match=message):
        identity.fingerprint_source(source)


def test_an_f_string_prefix_is_kept_sorted_and_lower_case():
    assert "Ffr:'{x}'" in identity.normalized_tokens("def f(x):\n    return rf'{x}'\n")
    assert identity.normalized_tokens("def f(x):\n    return Rf'{x}'\n") == identity.normalized_tokens(
        "def f(x):\n    return fR'{x}'\n")


SOFT_KEYWORDS = """\
def f(x):
    match (x,):
        case (1,):
            return 1
        case _:
            return 2
"""


@pytest.mark.skipif(sys.version_info < (3, 10), reason="match statements are Python 3.10+")
def test_soft_keywords_in_an_indented_method_are_those_of_the_unindented_text():
    """The ``ast`` positions of ``match``, a case pattern and the wildcard are shifted by the margin."""
    indented = textwrap.indent(SOFT_KEYWORDS, "    ")
    assert identity.normalized_tokens(indented) == identity.normalized_tokens(SOFT_KEYWORDS)
    assert "Kmatch" in identity.normalized_tokens(indented)
    assert "K_" in identity.normalized_tokens(indented)
    assert identity.fingerprint_source(indented) != identity.fingerprint_source(
        indented.replace("case (1,):", "case (1):"))
    assert identity.fingerprint_source(indented) != identity.fingerprint_source(
        indented.replace("match (x,):", "match (x):"))


# --------------------------------------------------------------------------- same code, same fingerprint
@pytest.mark.parametrize("first, second", [
    ("async for (x) in (y):\n    g()", "async for x in y:\n    g()"),
    ("for x in (y):\n    g()", "for x in y:\n    g()"),
    ("for x[i in s] in (y):\n    g()", "for x[i in s] in y:\n    g()"),  # the "in" inside brackets is not it
    ("x = (f(a=1))", "x = f(a=1)"),  # the "=" of a keyword argument splits nothing
    ("x = ((a, b), c,)", "x = ((a, b), c)"),
    ("x = f(a)(b,)", "x = f(a)(b)"),  # a call of a call's result
    ("if lambda a=lambda: 1: a: g()", "if lambda a=lambda: 1: a:\n    g()"),  # two lambdas, then the colon
])
def test_same_code_same_fingerprint(first, second):
    assert _statement(first) == _statement(second)


def test_async_for_parentheses_are_those_of_for():
    body = "async def f(y):\n    async for (x) in (y):\n        pass\n"
    assert identity.fingerprint_source(body) == identity.fingerprint_source(body.replace("(x) in (y)", "x in y"))


# --------------------------------------------------------------------------- different code, different one
@pytest.mark.parametrize("first, second", [
    ("with (a, b) in c:\n    g()", "with a, b in c:\n    g()"),  # one context manager vs two
    ("x = (f(a, b, c),)", "x = (f(a, b, c))"),  # a 1-tuple holding a call vs the call
])
def test_different_code_different_fingerprint(first, second):
    assert _statement(first) != _statement(second)


def test_a_definition_whose_lines_are_blank_now_has_no_source(module_from):
    """The file was emptied after import: ``inspect`` still hands back the (blank) lines where the
    definition was, which are no source."""
    module = module_from("h5_identity_blanked", UNWRAP)
    function = module.plain
    with open(module.__file__, "w") as handle:
        handle.write("\n" * UNWRAP.count("\n"))
    linecache.checkcache(module.__file__)
    assert identity.examine(function) == (None, identity.NO_SOURCE)


@pytest.mark.skipif(sys.version_info < (3, 10), reason="match statements are Python 3.10+")
def test_the_module_docstring_says_what_a_one_line_case_body_gets():
    """A one-line ``case`` body fingerprints as its block, and the docstring's list of formatting
    changes that give a different fingerprint does not name it."""
    one_line = "def f(x):\n    match x:\n        case 1: return x\n"
    block = "def f(x):\n    match x:\n        case 1:\n            return x\n"
    assert identity.fingerprint_source(one_line) == identity.fingerprint_source(block)
    limits = identity.__doc__.split("Formatting changes those rules do not cover")[1].split("Differences are")[0]
    assert "case" not in limits
    assert "one-line ``case`` body" in identity.__doc__
