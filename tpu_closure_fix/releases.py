"""The release guard: which Lightning release is the code actually loaded from?

The release is read from the *loaded* package (``__version__``), not from
installed-distribution metadata: the ``lightning_lite`` inside a
pytorch-lightning 1.8 wheel and the ``lightning_fabric`` inside
pytorch-lightning 1.9+ have no distribution of their own, and a ``PYTHONPATH``
or vendored copy can shadow what pip installed. Metadata is used only to name
the owning distribution in reports.
"""
import os
import sys

#: specifier string -> predicate(Version), parsed once.
_specifiers = {}


def loaded_release(package):
    """Release string of the loaded package governing ``package`` (or None).

    ``package`` is a top-level name, a sub-package of the unified
    ``lightning`` distribution (whose release is ``lightning.__version__``), or
    a namespace package's distribution (``<namespace>.<name>``: its own
    ``__version__``, or its ``version`` module's, where the package is a lazy
    module that does not carry it; the namespace itself has none).
    """
    top = sys.modules.get(package.split(".")[0])
    version = getattr(top, "__version__", None)
    if isinstance(version, str) and version:
        return version
    about = getattr(top, "__about__", None)
    version = getattr(about, "__version__", None)
    if isinstance(version, str) and version:
        return version
    if "." in package:  # a distribution inside a namespace package, which has no release of its own
        for name in (package, package + ".version"):  # the package, or its version module (a lazy package)
            version = getattr(sys.modules.get(name), "__version__", None)
            if isinstance(version, str) and version:
                return version
    return _release_while_initializing(top)


def _release_while_initializing(top):
    """The release of a top-level package whose ``__init__`` is still running, or None.

    A call-site module can finish importing while its top-level package has not
    yet set ``__version__`` (torch_xla 2.x imports ``xla_model`` before it reads
    its ``version`` module). Then, and only then, the release comes from the
    installed distribution of the same name -- if that distribution's files are
    exactly the ones loaded (its ``<top>/__init__.py`` is the loaded module's
    file), so a vendored or shadowing copy is never given another copy's release.
    """
    spec = getattr(top, "__spec__", None)
    location = getattr(top, "__file__", None)
    if not getattr(spec, "_initializing", False) or not location:
        return None
    try:
        from importlib import metadata

        dist = metadata.distribution(top.__name__)
        installed = dist.locate_file("%s/__init__.py" % top.__name__)
        if os.path.realpath(str(installed)) != os.path.realpath(location):
            return None
        return dist.version or None
    except Exception:
        return None


def _version_types():
    """``(Version, InvalidVersion)`` of ``packaging.version``, imported at the first comparison: an interpreter
    with no framework installed may have no ``packaging`` (``status --python`` asks such interpreters too), and
    nothing is compared there."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError as exc:  # said with its fix: the interpreter asked about may lack it
        raise ImportError("packaging is not importable (%s): the release guard compares releases with it; "
                          "pip install packaging" % exc)
    return Version, InvalidVersion


def in_range(release, specifier):
    """True when ``release`` (a string) is inside the PEP 440 ``specifier`` (pre-releases included)."""
    Version, InvalidVersion = _version_types()
    try:
        version = Version(release)
    except (InvalidVersion, TypeError):
        return False
    contains = _specifiers.get(specifier)
    if contains is None:
        contains = _specifiers[specifier] = _parse_specifier(specifier)
    return contains(version)


def _parse_specifier(specifier):
    """A predicate equal to ``SpecifierSet(specifier).contains(v, prereleases=True)``.

    The table's ranges are all ``>=A`` and ``<B`` clauses: those are evaluated here with
    ``packaging.version`` alone, exactly as ``packaging.specifiers`` does (``>=`` compares the
    public version; ``<B`` excludes pre-releases of B itself unless B is one). Why not
    SpecifierSet: importing ``packaging.specifiers`` costs about 23 ms (recent packaging), more
    than the rest of the shim's import when the framework does not import it itself (accelerate
    does not). Any other clause falls back to ``packaging.specifiers``, imported then.
    """
    Version, InvalidVersion = _version_types()
    bounds = []
    for clause in specifier.split(","):
        clause = clause.strip()
        op = ">=" if clause.startswith(">=") else "<" if clause.startswith("<") and clause[1:2] != "=" else None
        try:
            bound = Version(clause[len(op):].strip()) if op else None
        except InvalidVersion:
            bound = None
        if bound is None:
            from packaging.specifiers import SpecifierSet

            spec = SpecifierSet(specifier)
            return lambda version: spec.contains(version, prereleases=True)
        bounds.append((op, bound))
    return lambda version: all(_satisfies(version, op, bound) for op, bound in bounds)


def _satisfies(version, op, bound):
    Version, _ = _version_types()
    if op == ">=":
        return Version(version.public) >= bound
    if not version < bound:
        return False
    # PEP 440: "<B" never admits a pre-release of B itself (unless B is a pre-release).
    return bound.is_prerelease or not version.is_prerelease or \
        Version(version.base_version) != Version(bound.base_version)


_owners = None


def owning_distributions(top_level):
    """Names and versions of installed distributions that ship ``top_level``.

    Reads metadata (RECORD or top_level.txt); for reports only, cached.
    """
    global _owners
    if _owners is None:
        _owners = {}
        try:
            from importlib import metadata
        except ImportError:  # pragma: no cover - Python < 3.8
            return []
        for dist in metadata.distributions():
            tops = set()
            try:
                text = dist.read_text("top_level.txt")
                if text:
                    tops.update(line.strip() for line in text.splitlines() if line.strip())
                for entry in dist.files or ():
                    parts = str(entry).replace("\\", "/").split("/")
                    if len(parts) > 1 and not parts[0].endswith((".dist-info", ".egg-info", ".data")):
                        tops.add(parts[0])
            except Exception:
                continue
            name = dist.metadata["Name"] if dist.metadata else None
            for top in tops:
                _owners.setdefault(top, []).append("%s %s" % (name, dist.version))
    return sorted(set(_owners.get(top_level, [])))
