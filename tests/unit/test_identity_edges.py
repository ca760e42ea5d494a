"""tpu_closure_fix.identity at its edges: what a decorator is bound to (dotted names, class bodies, a name
gone), source that no longer matches its code (each reason), matching and release order, and the
normalization rules for trailing commas after values, keywords and literals.

Live functions are imported from module files written for the test (the test module's own functions
are rewritten by pytest's assert hook and rightly have no matching source).
"""
import linecache
import sys
import textwrap

import pytest

from test_identity import WRAPPING
from support.module_files import module_from  # noqa: F401  (a fixture)
from tpu_closure_fix import identity


def _fp(source):
    return identity.fingerprint_source(textwrap.dedent(source))


def _statement(statement):
    return _fp("def f(a, b, i, x):\n    %s\n" % statement)


# --------------------------------------------------------------------------- what decorators are bound to
DECORATED = """
import functools
import typing_extensions
import {helper}
""" + WRAPPING.replace("{", "{{").replace("}", "}}") + """

def register(name):
    return lambda function: function


marker = typing_extensions.override
gone = typing_extensions.override


class Outer:
    class Inner:
        ok = staticmethod

        @ok
        def inner_static(x):
            return x

    ok = wrapping

    @typing_extensions.override
    def dotted(self):
        return 1

    @{helper}.typing_extensions.override
    def dotted_twice(self):
        return 2

    @register("step")
    def called(self):
        return 3

    @gone
    def unbound_now(self):
        return 4

    @marker
    @staticmethod
    def twice_wrapped(x):
        return x


del gone
marker = staticmethod  # rebound after the class was built: judged by its binding now
"""


@pytest.fixture
def decorated(module_from):
    module_from("h4_identity_helper", "import typing_extensions\n")
    return module_from("h4_identity_decorated", DECORATED.format(helper="h4_identity_helper"))


def test_a_dotted_decorator_is_looked_up_through_its_modules(decorated):
    assert identity.decorators_known(vars(decorated.Outer)["dotted"]) is True
    assert identity.decorators_known(vars(decorated.Outer)["dotted_twice"]) is True


def test_the_class_body_the_method_is_defined_in_binds_its_decorators(decorated):
    """``ok`` is ``staticmethod`` in ``Inner``'s body (and a wrapping function in ``Outer``'s)."""
    assert identity.decorators_known(vars(decorated.Outer.Inner)["inner_static"]) is True


@pytest.mark.parametrize("name", ["called", "unbound_now", "twice_wrapped"])
def test_decorators_that_are_not_known(decorated, name):
    """A call, a name bound to nothing now, and two wrapping decorators (a static method cannot be both)."""
    assert identity.decorators_known(vars(decorated.Outer)[name]) is False


def test_no_source_or_no_definition_is_not_known(module_from):
    namespace = {}
    exec(compile("def made(a):\n    return a\n", "<made>", "exec"), namespace)
    assert identity.decorators_known(namespace["made"]) is False
    module = module_from("h4_identity_lambda", "step = lambda x: x\n")
    assert identity.decorators_known(module.step) is False


# --------------------------------------------------------------------------- source that no longer matches
ORIGINAL = """
class Holder:
    def step(self, a, b=dict(c=1)):
        return self.__a__b

    def helper(self, a):
        return len(a)
"""


@pytest.mark.parametrize("edited, reason", [
    ("def stop(self, a, b=dict(c=1)):", "defines stop, the code is step"),
    ("def step(self, a, z=dict(c=1)):", "parameters differ"),
])
def test_each_reason_source_on_disk_does_not_match(module_from, edited, reason):
    module = module_from("h4_identity_edited_%d" % len(reason), ORIGINAL)
    function = module.Holder.step
    assert identity.examine(function).reason == ""  # a keyword in a default value is not a parameter
    path = module.__file__
    with open(path, "w") as handle:
        handle.write(ORIGINAL.replace("def step(self, a, b=dict(c=1)):", edited))
    linecache.checkcache(path)
    assert identity.examine(function) == (None, "source on disk does not match the loaded code (%s)" % reason)


def test_a_name_the_code_refers_to_is_missing_from_the_source(module_from):
    module = module_from("h4_identity_refers", ORIGINAL)
    function = module.Holder.helper
    with open(module.__file__, "w") as handle:
        handle.write(ORIGINAL.replace("return len(a)", "return a").replace("self.__a__b", "self._private"))
    linecache.checkcache(module.__file__)
    assert identity.examine(function) == (None, "source on disk does not match the loaded code (the code refers "
                                                "to len)")
    assert identity.examine(module.Holder.step).reason == ("source on disk does not match the loaded code (the code "
                                                           "refers to _Holder__a__b)")


# --------------------------------------------------------------------------- matching and release order
def test_the_newest_identical_release_by_release_order_not_text():
    value = _fp("def f():\n    pass\n")
    found = identity.match_fingerprint(value, {"2.9.0": value, "2.10.0": value})
    assert found == (value, "2.10.0", "code identical to 2.10.0")


def test_what_a_differing_match_reads_like_by_count():
    value, other = _fp("def f():\n    pass\n"), _fp("def g():\n    pass\n")
    three = identity.match_fingerprint(value, {"1.0": other, "1.1": other, "1.2": other})
    assert three == (value, None, "code differs from 1.0, 1.1, 1.2")
    four = identity.match_fingerprint(value, {"1.0": other, "1.1": other, "1.2": other, "1.3": other})
    assert four == (value, None, "code differs from all 4 known releases (1.0 .. 1.3)")
    assert identity.match_fingerprint(value, {"1.0": None}) == (
        value, None, "cannot tell: no known release has a fingerprint")


def test_release_order_of_pre_post_and_dev_releases():
    releases = ["1.0", "1.0.post1", "1.0.post1.dev1", "1.0rc1", "1.0b1", "1.0a2", "1.0a1", "1.0.dev1"]
    assert sorted(releases, key=identity.release_key) == [
        "1.0.dev1", "1.0a1", "1.0a2", "1.0b1", "1.0rc1", "1.0", "1.0.post1.dev1", "1.0.post1"]
    assert identity.release_key("2.0") == identity.release_key("2") == identity.release_key("v2.0.0")


def test_text_that_is_no_release_sorts_first_by_text():
    assert sorted(["2.0", "zeta", "1.0", "alpha"], key=identity.release_key) == ["alpha", "zeta", "1.0", "2.0"]


# --------------------------------------------------------------------------- normalization
@pytest.mark.parametrize("first, second", [
    ("(a,) = x", "a = x"),  # a 1-tuple target at the start of a line
    ('y = "ab"[i,]', 'y = "ab"[i]'),  # a subscript of a string literal indexes with a tuple
    ('y = f"{a}"[i,]', 'y = f"{a}"[i]'),
    ("y = 1.5[i,]", "y = 1.5[i]"),
    ("y = None[i,]", "y = None[i]"),
    ("y = True[i,]", "y = True[i]"),
    ("y = False[i,]", "y = False[i]"),
])
def test_a_comma_after_a_value_s_bracket_keeps_its_meaning(first, second):
    assert _statement(first) != _statement(second)


@pytest.mark.parametrize("first, second", [
    ("f(a,)", "f(a)"),  # a call as a whole statement
    ("y = x in [a,]", "y = x in [a]"),  # after a keyword: a list display
])
def test_a_trailing_comma_that_is_noise(first, second):
    assert _statement(first) == _statement(second)


def test_text_between_two_tokenizer_positions():
    """How 3.12+'s f-string parts are joined back into the literal (rows from 1, columns from 0)."""
    lines = ["x = f'{a}\n", "  {b}' + 1\n", "z\n"]
    assert identity._slice(lines, (1, 4), (1, 9)) == "f'{a}"
    assert identity._slice(lines, (1, 4), (2, 6)) == "f'{a}\n  {b}'"
    assert identity._slice(lines + ["w\n"], (1, 4), (3, 1)) == "f'{a}\n  {b}' + 1\nz"


@pytest.mark.parametrize("one_line, block", [
    ("async with a as b: g()", "async with a as b:\n        g()"),
    ("async for a in b: g()", "async for a in b:\n        g()"),
    ("if lambda: x: g()", "if lambda: x:\n        g()"),  # the lambda's colon is not the header's
    ("if lambda: lambda: x: g()", "if lambda: lambda: x:\n        g()"),
    ("match x:\n        case {1: a}: g()", "match x:\n        case {1: a}:\n            g()"),
])
def test_one_line_compound_statements_are_their_blocks(one_line, block):
    if one_line.startswith("match") and sys.version_info < (3, 10):
        pytest.skip("match statements parse on Python >= 3.10 only")
    source = "async def f(a, b, i, x):\n    %s\n"
    assert _fp(source % one_line) == _fp(source % block)
    assert _fp(source % one_line) != _fp(source % block.replace("g()", "h()"))


# --------------------------------------------------------------------------- recorded fingerprints
# The fingerprints recorded in the call-site tables (sites) hold only while the normalization is the
# same: any change to the token stream of these sources must come with a new identity.FORMAT.
RECORDED_SOURCES = {
    'annotated assignment': (
        'def f(x):\n'
        '    y: int = x\n'
        '    z: list = [y,]\n'
        '    return z\n'
    ),
    'async blocks': (
        'async def f(a, b):\n'
        '    async with a as c: await c\n'
        '    async for d in b:\n'
        '        yield d\n'
    ),
    'lambda in a header': (
        'def f(a):\n'
        '    if lambda: a: return (lambda b, *c, d=1, **e: b)(a)\n'
    ),
    'match and case': (
        'def f(x):\n'
        '    match x:\n'
        '        case [1, *rest] if rest: return rest\n'
        "        case {'k': v}: return v\n"
        '        case _: return None\n'
    ),
    'soft keywords as names': (
        'def f(match, case, type, _):\n'
        '    match[0] = case\n'
        '    type = _\n'
        '    return match, type\n'
    ),
    'literals': (
        'def f():\n'
        "    return 0x1F, 1_000, 2.5e3, 3j, b'\\x00raw', rb'\\d', 'a' 'b', u'c', f'{1!r:>{2}}', '''doc'''\n"
    ),
    'identifiers and operators': (
        'def f(\xe9t\xe9, x):\n'
        '    x @= \xe9t\xe9; x **= 2; x //= 3\n'
        '    return x if x else -x\n'
    ),
    'decorated method': (
        '    @staticmethod\n'
        '    def f(a, /, b, *, c):\n'
        '        del a\n'
        "        assert b, 'm'\n"
        '        with open(c) as h, open(b): pass\n'
    ),
    'brackets and commas': (
        'def f(a, b, i):\n'
        '    x = (a,)\n'
        '    y = a[i,]\n'
        '    z = [a, b,], {a: b,}, {a,}, g(a, b,)\n'
        '    return (x), (y, z), ()\n'
    ),
    'nested definitions': (
        'def f(a):\n'
        '    def g(b):\n'
        '        class C:\n'
        '            def h(self): return b\n'
        '        return C\n'
        '    return [g(x) for x in a if x], {k: v for k, v in a}\n'
    ),
}
RECORDED = {
    'annotated assignment': 'sha256:fe5acbd586e46240',
    'async blocks': 'sha256:fbd1d20d2f38ae05',
    'lambda in a header': 'sha256:de34db84aefca61a',
    'match and case': 'sha256:7e20ac7b05b9646d',
    'soft keywords as names': 'sha256:4eb73edc336dd554',
    'literals': 'sha256:cd6305b4d46f7fef',
    'identifiers and operators': 'sha256:275901931872a761',
    'decorated method': 'sha256:e9a3e8f2f5f0d9ab',
    'brackets and commas': 'sha256:40b4541a85ef6524',
    'nested definitions': 'sha256:973ddd930c1e1351',
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_fingerprints_recorded_under_this_format_stay_the_same(name):
    if "case" in RECORDED_SOURCES[name] and "match x" in RECORDED_SOURCES[name] and sys.version_info < (3, 10):
        pytest.skip("match statements parse on Python >= 3.10 only")
    assert identity.FORMAT == 1
    assert identity.fingerprint_source(RECORDED_SOURCES[name]) == RECORDED[name]
