"""Copies of an installed package that claim another release, optionally with edited source.

A test presents the installed release as one the shim's table does not name (the next release, or the
same code with one method edited) by copying its package, rewriting ``version.info`` and putting the
copy first on the path.
"""
import os
import shutil


def copy_presented_as(installed_root, name, root, version):
    """Copy package ``name`` from ``installed_root`` to ``root / name``, claiming ``version``; returns the copy."""
    package = root / name
    shutil.copytree(os.path.join(installed_root, name), str(package),
                    ignore=shutil.ignore_patterns("__pycache__"))
    (package / "version.info").write_text(version + "\n")
    return package


def replace_once(path, old, new, changed_message):
    """Replace the single occurrence of ``old`` in the file ``path`` with ``new``.

    The edit must land exactly once: if the release's source no longer holds ``old`` (or holds it twice),
    the test would otherwise run against unedited code, so it fails with ``changed_message``.
    """
    text = path.read_text()
    assert text.count(old) == 1, changed_message
    path.write_text(text.replace(old, new))
