"""Which release-matrix targets run which target tests (tests/target/conftest.py ONLY_ON): every row
names a test module (and function) and targets that exist, so a renamed test or target cannot silently
drop out of the matrix."""
import ast
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_TESTS = os.path.join(os.path.dirname(HERE), "target")
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def selection():
    return _load("target_conftest_under_test", os.path.join(TARGET_TESTS, "conftest.py"))


@pytest.fixture(scope="module")
def targets():
    return set(_load("targets_script_under_test", os.path.join(SCRIPTS, "targets.py")).TARGETS)


def _test_functions(module_file):
    """Names of the test functions defined at the top level of a target test module."""
    with open(os.path.join(TARGET_TESTS, module_file)) as handle:
        tree = ast.parse(handle.read())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def _rows(selection):
    """ONLY_ON split by key kind: {module file: targets}, {(module file, function): targets}."""
    modules, functions = {}, {}
    for key, names in selection.ONLY_ON.items():
        if "::" in key:
            functions[tuple(key.split("::"))] = names
        else:
            modules[key] = names
    return modules, functions


def test_every_module_entry_names_a_module_and_known_targets(selection, targets):
    modules, _ = _rows(selection)
    assert modules
    for module_file, names in modules.items():
        assert os.path.isfile(os.path.join(TARGET_TESTS, module_file)), module_file
        assert names and set(names) <= targets, (module_file, set(names) - targets)


def test_every_test_entry_names_a_test_function_and_targets_its_module_runs_on(selection, targets):
    modules, functions = _rows(selection)
    assert functions
    for (module_file, function), names in functions.items():
        key = module_file + "::" + function
        assert function in _test_functions(module_file), key
        assert names and set(names) <= targets, (key, set(names) - targets)
        module_targets = modules.get(module_file)
        if module_targets is not None:  # a test restricted to targets its module never runs on would never run
            assert set(names) <= set(module_targets), (key, set(names) - set(module_targets))
