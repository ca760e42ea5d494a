"""XLA optimizer steps in the installed frameworks that no row of the call-site table covers.

A row names the method whose step it fixes. A release can hold such a step in a method no row names (an
older release than the table knows, a new helper in a newer one): ``status`` would list no site for it
and say nothing is wrong. So the source of every installed framework package is read (never imported:
``importlib.util.find_spec`` locates it) and two shapes of the bug class are found with the ``ast``:

1. a call of torch_xla's ``xla_model.optimizer_step`` that passes ``optimizer_args`` (the argument that
   carries a closure into the step: the reduction runs before it);
2. in a function with a ``closure`` parameter, a gradient reduction (a call named ``*all_reduce*``,
   ``*allreduce*``, ``*reduce_gradients*``) before a ``.step(...)`` call that is passed the closure.

A finding whose enclosing method is not a site of the table is *uncovered*, and verdicts turn into
"could not verify", naming its file and line.

Limits, stated: (1) sees only calls spelled ``X.optimizer_step(...)`` where ``X`` is bound to
``torch_xla.core.xla_model`` in that file (``import torch_xla.core.xla_model as xm``, ``from
torch_xla.core import xla_model``) or the dotted path itself; (2) goes by the names called, in source
order. A call through another indirection (``getattr``, a variable holding the function) is not seen;
a finding is a place to verify, never a verdict of "affected". Files that contain neither
``optimizer_step`` nor ``closure`` are not parsed.
"""
import ast
import importlib.util
import os

XLA_MODEL = "torch_xla.core.xla_model"


def _xla_model_names(tree):
    """Names bound to torch_xla.core.xla_model anywhere in the file (imports inside functions included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == XLA_MODEL and alias.asname:
                    names.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch_xla.core":
            for alias in node.names:
                if alias.name == "xla_model":
                    names.add(alias.asname or "xla_model")
    return names


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_step_with_args(call, names):
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "optimizer_step"):
        return False
    owner = _dotted(func.value)
    if owner not in names and owner != XLA_MODEL:
        return False
    # optimizer_step(optimizer, barrier=False, optimizer_args={}, ...): the third positional is optimizer_args
    return any(keyword.arg == "optimizer_args" for keyword in call.keywords) or len(call.args) >= 3


#: Calls that reduce gradients across replicas, by the name called (the last part of a dotted name).
REDUCING = ("all_reduce", "allreduce", "reduce_gradients")


def _called_name(call):
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _passes(call, name):
    return any(isinstance(a, ast.Name) and a.id == name for a in list(call.args) +
               [k.value for k in call.keywords])


def _reduces_before_the_closure(function):
    """Line of the first gradient reduction of a function with a ``closure`` parameter that comes before
    a ``.step(...)`` call passing that closure (accelerate's and optimum-neuron's shape), else None."""
    names = [a.arg for a in function.args.args + function.args.kwonlyargs]
    if "closure" not in names:
        return None
    calls = sorted((n for n in ast.walk(function) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    first_reduction = None
    for call in calls:
        name = _called_name(call).lower()
        if first_reduction is None and any(word in name for word in REDUCING):
            first_reduction = call.lineno
        elif first_reduction is not None and name == "step" and _passes(call, "closure"):
            return first_reduction
    return None


class _Finder(ast.NodeVisitor):
    """Each call found, with the qualified name of the method (or function) around it."""

    def __init__(self, names):
        self.names, self.stack, self.found = names, [], []

    def _scope(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_ClassDef = _scope

    def _function(self, node):
        line = _reduces_before_the_closure(node)
        if line is not None:
            self.found.append((".".join((self.stack + [node.name])[:2]), line))
        self._scope(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Call(self, node):
        if _is_step_with_args(node, self.names):
            self.found.append((".".join(self.stack[:2]) or "<module>", node.lineno))
        self.generic_visit(node)


def calls_in_source(source):
    """``[(qualname, line)]``: the closure-carrying ``xm.optimizer_step`` calls of one file's source, and
    the gradient reductions that run before a step given a closure."""
    if "optimizer_step" not in source and "closure" not in source:
        return []
    tree = ast.parse(source)
    finder = _Finder(_xla_model_names(tree))
    finder.visit(tree)
    return finder.found


def _package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _covered(module, qualname, keys):
    """Is (module, qualname) a site of the table? A name-mangled method (``__step`` in class ``C``) matches
    its mangled spelling ``C._C__step`` too."""
    if (module, qualname) in keys:
        return True
    cls, _, method = qualname.partition(".")
    if method.startswith("__") and not method.endswith("__"):
        return (module, "%s._%s%s" % (cls, cls.lstrip("_"), method)) in keys
    return False


def uncovered_steps(packages=None):
    """``[{"file", "line", "module", "function"}]``: the calls of :func:`calls_in_source` in the installed
    framework packages (default: every integration's packages but torch_xla) that no site covers."""
    from .. import sites

    keys = set(sites.site_keys())
    if packages is None:
        packages = sorted(p for p in sites.top_level_packages() if p != "torch_xla")
    found = []
    for package in packages:
        root = _package_dir(package)
        if root is None:
            continue
        for folder, _, files in os.walk(root):
            for filename in sorted(files):
                if not filename.endswith(".py"):
                    continue
                path = os.path.join(folder, filename)
                try:
                    with open(path, encoding="utf-8") as handle:
                        calls = calls_in_source(handle.read())
                except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                    continue
                relative = os.path.relpath(path[:-3], os.path.dirname(root)).replace(os.sep, ".")
                module = package.rsplit(".", 1)[0] + "." + relative if "." in package else relative
                module = module[:-len(".__init__")] if module.endswith(".__init__") else module
                for qualname, line in calls:
                    if not _covered(module, qualname, keys):
                        found.append({"file": path, "line": line, "module": module, "function": qualname})
    return found
