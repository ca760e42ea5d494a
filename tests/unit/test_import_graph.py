"""The package's modules import one another without a cycle: each pair of modules is ordered, one uses the other.

Every ``import`` statement of every module counts, the ones inside functions too (a lazy import is still a
dependency: it only hides the cycle until the function runs). The graph is read from the source (``ast``),
never by importing, and its cycles are found as strongly connected components.
"""
import ast
import os

PACKAGE = "tpu_closure_fix"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), PACKAGE)


def module_files(root=ROOT, package=PACKAGE):
    """{dotted module name: (path, is a package)} of every ``.py`` file under ``root``."""
    found = {}
    for folder, _, files in os.walk(root):
        for filename in files:
            if not filename.endswith(".py"):
                continue
            path = os.path.join(folder, filename)
            parts = [package] + os.path.relpath(path[:-3], root).split(os.sep)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _targets(node, name, is_package, modules, package):
    """The package's modules one import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == package]
    base = name if is_package else name.rpartition(".")[0]
    if node.level:
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        target = base + ("." + node.module if node.module else "")
    else:
        target = node.module or ""
    if target.split(".")[0] != package:
        return []
    # ``from . import x`` names the module x when there is one, else an attribute of the package
    return [target + "." + alias.name if target + "." + alias.name in modules else target for alias in node.names]


def import_graph(modules, package=PACKAGE):
    """{module: set of the package's modules it imports}, read from every import statement of its source."""
    graph = {}
    for name, (path, is_package) in modules.items():
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        graph[name] = {target for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                       for target in _targets(node, name, is_package, modules, package)
                       if target in modules and target != name}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(start):
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for target in edges:
                if target not in index:
                    index[target] = low[target] = counter[0]
                    counter[0] += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph(module_files())
    assert graph["tpu_closure_fix.outcome.payload"], "the graph read no import of outcome/payload.py"
    assert cycles(graph) == []


def test_the_payload_uses_fresh_and_fresh_does_not_use_the_outcome():
    graph = import_graph(module_files())
    assert "tpu_closure_fix.verify.fresh" in graph["tpu_closure_fix.outcome.payload"]
    assert not [name for name in graph["tpu_closure_fix.verify.fresh"] if name.startswith("tpu_closure_fix.outcome")]


def test_a_cycle_through_a_lazy_import_is_found(tmp_path):
    """The twin: two modules importing each other, one of them inside a function, make one cycle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (package / "c.py").write_text("from . import a\nimport os\n")
    graph = import_graph(module_files(str(package), "pkg"), "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    (package / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert cycles(import_graph(module_files(str(package), "pkg"), "pkg")) == []
