"""Verification driver for the optimum-neuron integration (used by the support table and ``check``).

The patching code never imports it. The release matrix runs optimum-neuron's
released optimizer module on stand-ins for torch_xla and the Neuron SDK
(tests/target/test_optimum_neuron.py); its scenarios are named
``optimum-neuron-*``.
"""


def matrix_scenarios(site, target):
    """Names of the scenarios of a release-matrix ``target`` that ran through ``site``: every
    ``optimum-neuron-*`` scenario (a target installs one optimum-neuron release, which one row matches)."""
    return [n for n in target.get("scenarios_run") or [] if n.startswith("optimum-neuron-")]
