"""Copies of an installed package that claim another release, optionally with edited source.

A test presents the installed release as one the shim's table does not name (the next release, or the
same code with one method edited) by copying its package, rewriting ``version.info`` and putting the
copy first on the path.
"""
import glob
import os
import shutil


def copy_package(source, destination):
    """Copy a package folder with its byte-compiled files: the installed targets are compiled once at install,
    and a child importing an uncompiled copy would compile all of it at every start (PYTHONDONTWRITEBYTECODE).
    A file edited afterwards must go through :func:`write_source`, which drops its stale bytecode."""
    shutil.copytree(str(source), str(destination))


def write_source(path, text):
    """Write ``text`` to the module file ``path`` and remove its cached bytecode: the cache is keyed by the source's
    size and whole-second modification time, which an edit of the same size within the same second would not change."""
    path.write_text(text)
    for cached in glob.glob(os.path.join(str(path.parent), "__pycache__", path.stem + ".*.pyc")):
        os.remove(cached)


def copy_presented_as(installed_root, name, root, version):
    """Copy package ``name`` from ``installed_root`` to ``root / name``, claiming ``version``; returns the copy."""
    package = root / name
    copy_package(os.path.join(installed_root, name), package)
    (package / "version.info").write_text(version + "\n")
    return package


def replace_once(path, old, new, changed_message):
    """Replace the single occurrence of ``old`` in the file ``path`` with ``new``.

    The edit must land exactly once: if the release's source no longer holds ``old`` (or holds it twice),
    the test would otherwise run against unedited code, so it fails with ``changed_message``.
    """
    text = path.read_text()
    assert text.count(old) == 1, changed_message
    write_source(path, text.replace(old, new))
