"""``tpu-closure-fix --help`` and README's first screen name every integration.

A user decides from these two places whether the tool concerns their training: an integration added
to tpu_closure_fix.integrations.NAMES without a label here fails the first test.
"""
import os

from tpu_closure_fix import cli, integrations

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: integration -> the words that name it for a user (each must appear in both places).
LABELS = {
    "lightning": ("Lightning Trainer", "Lite/Fabric"),
    "accelerate": ("Hugging Face accelerate",),
    "optimum_neuron": ("optimum-neuron",),
    "torch_xla": ("torch_xla loops",),
}


def _first_screen():
    with open(os.path.join(REPO, "README.md")) as handle:
        return handle.read().split("\n## ", 1)[0]


def _help():
    # argparse wraps lines, also after a hyphen: compare the words, re-joined
    return " ".join(cli.build_parser().format_help().split()).replace("- ", "-")


def test_every_integration_has_a_label():
    assert sorted(LABELS) == sorted(integrations.NAMES)


def test_help_names_every_integration():
    text = _help()
    assert [label for labels in LABELS.values() for label in labels if label not in text] == [], text


def test_readme_first_screen_names_every_integration():
    text = " ".join(_first_screen().split())
    assert [label for labels in LABELS.values() for label in labels if label not in text] == [], text
