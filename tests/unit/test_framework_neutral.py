"""The core names no framework: every Lightning module and class is named under tpu_closure_fix/integrations/.

Scans the code of every module of the package outside ``integrations/``:
identifiers, attribute names and string literals, but not comments and
docstrings (prose may say what the package is for). A Lightning module path
(``pytorch_lightning``, ``lightning_fabric``, ``lightning_lite``,
``lightning.pytorch``/``.fabric``/``.lite``, ``import lightning``) is an error
anywhere in that code; a Lightning class name is an error as an identifier or
as a string that is a name (``getattr(module, "Trainer")``), not inside a
sentence of a message. The start-up module (startup/, outside the package)
keeps a literal list of top-level package names, which tests/unit/test_config.py
checks against the integrations' PACKAGES.
"""
import io
import os
import re
import tokenize

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "tpu_closure_fix")
INTEGRATIONS = os.path.join(PACKAGE, "integrations")

MODULE_PATH = re.compile(r"\b(pytorch_lightning|lightning_fabric|lightning_lite)\b|\blightning\.(pytorch|fabric|lite)\b")
CLASS_NAMES = frozenset((
    "TPUPrecisionPlugin", "TPUBf16PrecisionPlugin", "XLAPrecisionPlugin", "XLAPrecision", "TPUPrecision",
    "TPUBf16Precision", "TPUAccelerator", "Trainer", "LightningModule", "LightningLite", "Fabric", "Callback",
    "MisconfigurationException",
))
NAME_LIKE = re.compile(r"^[\w.]+$")


def core_modules():
    """Every .py file of the package outside integrations/, relative to the repo."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and os.path.join(folder, d) != INTEGRATIONS)
        found.extend(os.path.relpath(os.path.join(folder, name), REPO) for name in sorted(files)
                     if name.endswith(".py"))
    return found


def _docstring_positions(tokens):
    """Start positions of string tokens that form a whole statement (docstrings and bare strings)."""
    positions = set()
    previous = tokenize.NEWLINE
    for index, token in enumerate(tokens):
        if token.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                                           tokenize.ENCODING):
            following = next((t for t in tokens[index + 1:] if t.type != tokenize.STRING), None)
            if following is None or following.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                positions.add(token.start)
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
    return positions


def _dotted_name(tokens, index):
    """The dotted name starting at ``tokens[index]`` (``lightning.fabric.x`` from ``lightning``)."""
    parts = [tokens[index].string]
    while index + 2 < len(tokens) and tokens[index + 1].string == "." and tokens[index + 2].type == tokenize.NAME:
        parts.append(tokens[index + 2].string)
        index += 2
    return ".".join(parts)


def framework_names(source):
    """[(line, text)] of every Lightning module path or class name in the code of ``source``."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    docstrings = _docstring_positions(tokens)
    hits = []
    for index, token in enumerate(tokens):
        if token.type == tokenize.NAME:
            dotted = _dotted_name(tokens, index)
            if token.string in CLASS_NAMES or MODULE_PATH.search(dotted):
                hits.append((token.start[0], dotted))
            elif token.string == "import" and re.match(r"\s*lightning\b", token.line[token.end[1]:]):
                hits.append((token.start[0], token.line.strip()))
        elif token.type == tokenize.STRING and token.start not in docstrings:
            value = token.string
            if MODULE_PATH.search(value):
                hits.append((token.start[0], value))
            else:
                body = value.strip("\"'rbuRBUfF")
                if NAME_LIKE.match(body) and set(body.split(".")) & CLASS_NAMES:
                    hits.append((token.start[0], value))
    return hits


def test_the_scan_finds_what_it_must():
    """The scan itself can fail: each kind of naming is found, prose is not."""
    code = ('"""Docstring about pytorch_lightning.Trainer."""\n'
            "import pytorch_lightning as pl  # a comment about lightning_fabric\n"
            "from lightning.fabric import x\n"
            "import lightning\n"
            "cls = getattr(module, 'XLAPrecision')\n"
            "path = 'lightning_lite.plugins'\n"
            "message = 'use Lite/Fabric loops'\n"
            "def f(trainer: Trainer):\n"
            "    '''Docstring naming LightningModule.'''\n")
    found = framework_names(code)
    assert [line for line, _ in found] == [2, 3, 4, 5, 6, 8], found


def test_core_modules_are_found():
    modules = core_modules()
    assert "tpu_closure_fix/engine.py" in modules and "tpu_closure_fix/sites.py" in modules
    assert not [m for m in modules if m.startswith("tpu_closure_fix/integrations/")]


@pytest.mark.parametrize("path", core_modules())
def test_core_module_names_no_lightning_module_or_class(path):
    with open(os.path.join(REPO, path)) as handle:
        hits = framework_names(handle.read())
    assert not hits, "%s names Lightning outside tpu_closure_fix/integrations/: %s" % (
        path, ", ".join("line %d: %s" % hit for hit in hits))


def test_the_verdict_rules_are_one_list_in_the_engine_and_the_docs():
    """engine._decide numbers its rules 1-13 in order and examine() holds rule 14; docs/ARCHITECTURE.md writes the
    same 14 rules out once, and docs/verification.md links there instead of listing them again."""
    import inspect
    import re

    from tpu_closure_fix import engine

    numbers = [int(n) for n in re.findall(r"^\s*# (\d+)\. ", inspect.getsource(engine._decide), re.M)]
    assert numbers == list(range(1, 14)), numbers
    assert re.search(r"# Rule 14 \(last\)", inspect.getsource(engine.examine))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "docs", "ARCHITECTURE.md")) as handle:
        section = handle.read().split("## A site's verdict: the rules, in order")[1].split("\n## ")[0]
    assert [int(n) for n in re.findall(r"^(\d+)\. ", section, re.M)] == list(range(1, 15))
    with open(os.path.join(repo, "docs", "verification.md")) as handle:
        text = handle.read()
    assert "(ARCHITECTURE.md#a-sites-verdict-the-rules-in-order)" in text
    assert not re.search(r"^\d+\. no row names the site", text, re.M | re.I)
