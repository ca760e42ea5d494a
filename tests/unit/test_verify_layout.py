"""Where verification code may and may not reach.

* Verification code (``tpu_closure_fix/verify`` and every ``integrations/*/verify.py``) names no
  framework module path of its own: it drives what the call-site table gives it (row ``module`` +
  ``qualname``, and the row's ``package``).  A hard-coded ``pytorch_lightning.plugins...`` would let
  the check trace a class the table never patched (an alias, a graveyard re-export).
* The patching core never depends on verification code, and importing the verification modules
  that ``check`` loads up front imports no torch, torch_xla or framework.
"""
import ast
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "tpu_closure_fix")

#: A framework module path: a Lightning package name followed by ``.something``, in any string or
#: comment (``lightning.`` alone also matches ``lightning.fabric``/``lightning.pytorch``).
FRAMEWORK_PATH = re.compile(r"\b(pytorch_lightning|lightning_fabric|lightning_lite|lightning)\.[A-Za-z_]")
#: Verification modules must not import the frameworks either (``import pytorch_lightning``).
FRAMEWORK_IMPORT = re.compile(r"^\s*(from|import)\s+(pytorch_lightning|lightning_fabric|lightning_lite|lightning)\b",
                              re.M)


def verification_files():
    files = []
    for folder, _, names in os.walk(os.path.join(PACKAGE, "verify")):
        files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    integrations = os.path.join(PACKAGE, "integrations")
    if os.path.isdir(integrations):
        for name in sorted(os.listdir(integrations)):
            driver = os.path.join(integrations, name, "verify.py")
            if os.path.isfile(driver):
                files.append(driver)
    return sorted(files)


def test_the_lightning_driver_is_among_the_files_checked():
    names = [os.path.relpath(f, REPO) for f in verification_files()]
    assert os.path.join("tpu_closure_fix", "integrations", "lightning", "verify.py") in names, names
    assert os.path.join("tpu_closure_fix", "verify", "graph.py") in names, names


def test_verification_code_hard_codes_no_framework_module_path():
    found = []
    for path in verification_files():
        with open(path) as handle:
            for number, line in enumerate(handle, 1):
                if FRAMEWORK_PATH.search(line) or FRAMEWORK_IMPORT.search(line):
                    found.append("%s:%d: %s" % (os.path.relpath(path, REPO), number, line.strip()))
    assert not found, "framework module paths in verification code (take them from the table):\n" + "\n".join(found)


def test_the_path_check_catches_what_it_should():
    """The patterns themselves: they match the kinds of line the test above must reject."""
    for bad in ('_import_attr("lightning_fabric.plugins.precision.tpu", "TPUPrecision")',
                "module = 'pytorch_lightning.loops.optimization.optimizer_loop'",
                'for mod in ("lightning.fabric.accelerators.tpu",):'):
        assert FRAMEWORK_PATH.search(bad), bad
    assert FRAMEWORK_IMPORT.search("import pytorch_lightning as pl")
    for fine in ("pl = _package(target.row)", "the Lightning integration", "torch_xla.core.xla_model"):
        assert not FRAMEWORK_PATH.search(fine) and not FRAMEWORK_IMPORT.search(fine), fine


def core_files():
    files = [os.path.join(PACKAGE, n) for n in ("engine.py", "sites.py", "fixes.py", "shape.py", "releases.py",
                                                 "config.py", "activation.py", "__init__.py")]
    integrations = os.path.join(PACKAGE, "integrations")
    if os.path.isdir(integrations):
        for folder, _, names in os.walk(integrations):
            # verify.py (what the checks drive) and demo.py (a command, like check) are not patching code
            files += [os.path.join(folder, n) for n in names if n.endswith(".py") and n not in ("verify.py", "demo.py")]
    return [f for f in files if os.path.isfile(f)]


def _verify_references(path):
    """Imports of verification modules, and strings naming one (an ``importlib`` call), in a file;
    docstrings may mention verification."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if "verify" in a.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            names = (node.module or "").split(".") + [a.name for a in node.names]
            if "verify" in names:
                found.append("from %s%s import ..." % ("." * node.level, node.module or ""))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if re.search(r"(^|\.)verify(\.|$)", node.value):
                found.append(repr(node.value))
    return found


def test_the_patching_core_does_not_reference_verification_code():
    found = {os.path.relpath(p, REPO): refs for p in core_files() for refs in [_verify_references(p)] if refs}
    assert not found, found


def test_the_reference_finder_sees_imports_and_module_strings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Mentions <name>/verify.py in the docstring: fine."""\n'
                      "from .verify import graph\n"
                      "import tpu_closure_fix.verify.child\n"
                      "importlib.import_module('tpu_closure_fix.integrations.x.verify')\n")
    assert len(_verify_references(str(sample))) == 3


def _modules_after(code):
    env = dict(os.environ, TPU_CLOSURE_FIX="1", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return set(__import__("json").loads(proc.stdout.splitlines()[-1]))


def test_enabling_the_shim_loads_no_verification_code():
    loaded = _modules_after("import tpu_closure_fix; tpu_closure_fix.enable()")
    assert not [m for m in loaded if m.startswith("tpu_closure_fix.verify") or m.endswith(".verify")], loaded


def test_verification_modules_import_nothing_heavy():
    loaded = _modules_after("import tpu_closure_fix.check, tpu_closure_fix.verify.graph, "
                            "tpu_closure_fix.verify.events, tpu_closure_fix.verify.table")
    heavy = {"torch", "torch_xla", "pytorch_lightning", "lightning", "lightning_fabric", "lightning_lite"} & loaded
    assert not heavy, heavy
