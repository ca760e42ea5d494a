"""Source text of a small ``torch_xla.core.xla_model`` for tests that write one to disk or exec it.

Its ``optimizer_step`` is the one in tpu_closure_fix/_simulated_xla.py, which is torch_xla's own body
(reduce, step, then ``mark_step`` if ``barrier``): the code the shim's torch_xla guard recognises.
The simulation's file is read, not imported: importing it through the package would run
``tpu_closure_fix/__init__`` and so activate the shim, which the tests must decide themselves.
"""
import ast
import os

SIMULATION = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "tpu_closure_fix", "_simulated_xla.py")

_STUBS = '''
def reduce_gradients(optimizer, groups=None, pin_layout=True):
    {on_reduce}


def mark_step(wait=False):
    {on_mark_step}


'''


def simulation_function_source(name):
    """The source text of the top-level function ``name`` of the simulation, ending in a line break."""
    with open(SIMULATION) as handle:
        text = handle.read()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) + "\n"
    raise LookupError("%s defines no function %s" % (SIMULATION, name))


def xla_model_source(on_reduce="pass", on_mark_step="pass"):
    """A module's source: ``reduce_gradients`` and ``mark_step`` running the statements ``on_reduce`` and
    ``on_mark_step`` (one line each), then torch_xla's ``optimizer_step`` calling them."""
    return _STUBS.format(on_reduce=on_reduce, on_mark_step=on_mark_step) + simulation_function_source("optimizer_step")
