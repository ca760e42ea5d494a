"""``module_from``: a pytest fixture importing a module written to a file, forgotten after the test.

Import it into a test module (``from support.module_files import module_from``) to use it there.
"""
import importlib
import sys
import textwrap

import pytest


@pytest.fixture
def module_from(tmp_path, monkeypatch):
    """``module_from(name, source)``: the module imported from a file holding ``source`` (dedented);
    ``module_from.folder`` is the folder the files are written to."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def load(name, source):
        (tmp_path / (name + ".py")).write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        written.append(name)
        return importlib.import_module(name)

    load.folder = tmp_path
    yield load
    for name in written:
        sys.modules.pop(name, None)
