"""The call-site table: every affected call site of every integration, as data.

Each integration (:mod:`tpu_closure_fix.integrations`) declares its rows; this
module only defines the row type and collects them. Everything else -- the
patch engine, ``status()``, the CLI, the support table and the release-matrix
tests -- is generic over :data:`CALL_SITES`.

Row fields (:class:`CallSite`):

* ``variant``: a unique name for the row.
* ``integration``: the integration that owns it (``lightning``, ``accelerate``, ``torch_xla``).
* ``package``: the package whose release governs the row (its ``__version__``).
* ``distribution``: who ships that code, for reports.
* ``module`` / ``qualname``: where the code lives: ``Class.method``, or a plain
  ``function`` of the module.
* ``releases``: PEP 440 specifier of the releases this row was checked against.
* ``shape``: the expected code shape (:mod:`tpu_closure_fix.shape`).
* ``fix``: the fix (a :class:`tpu_closure_fix.fixes.Fix`), or None for code that
  already carries the upstream fix (verified by ``shape``, never touched).
* ``inherits``: for subclasses that inherit the method, the qualname of the base
  class method; they are covered by patching the base.
* ``fingerprints``: ``(release, fingerprint)`` pairs of the row's known code
  (:mod:`tpu_closure_fix.identity`). A release newer than every row of its
  package whose method has one of these fingerprints is the same code, and is
  patched with this row's fix.
* ``note``: free text for the support table.
"""
from collections import namedtuple

CallSite = namedtuple(
    "CallSite",
    "variant integration package distribution module qualname releases shape fix inherits fingerprints note",
)


#: Code of a site read and found handing no closure to torch_xla, in a release range no row names: the
#: site is "not in this release" there while its code holds none of ``forbids`` (the buggy call's names).
NotAffected = namedtuple("NotAffected", "package module qualname releases forbids why")


def make_site(variant, integration, package, distribution, module, qualname, releases, shape=None, fix=None,
              inherits=None, fingerprints=(), note=""):
    return CallSite(variant, integration, package, distribution, module, qualname, releases, shape, fix, inherits,
                    tuple(fingerprints), note)


def fingerprint_table(text):
    """``{variant: ((release, fingerprint), ...)}`` from a text table, one row a line: the variant, then one
    ``release=fingerprint`` pair per distinct code the row covers (blank lines and ``#`` comments skipped).

    Written as text so that each integration's measured fingerprints read as the table they are."""
    table = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        variant, pairs = words[0], words[1:]
        if not pairs or variant in table or not all(pair.count("=") == 1 for pair in pairs):
            raise ValueError("fingerprint table: bad row %r (expected 'variant release=sha256:... ...', "
                             "one row per variant)" % line.strip())
        table[variant] = tuple(tuple(pair.split("=")) for pair in pairs)
    return table


def _collect():
    from . import integrations

    rows = []
    for integration in integrations.load():
        rows.extend(integration.CALL_SITES)
    return tuple(rows)


CALL_SITES = _collect()


def _collect_not_affected():
    from . import integrations

    entries = []
    for integration in integrations.load():
        entries.extend(getattr(integration, "NOT_AFFECTED", ()))
    return tuple(entries)


NOT_AFFECTED = _collect_not_affected()


def not_affected_for(module, qualname):
    """The :data:`NOT_AFFECTED` entries of one site."""
    return [entry for entry in NOT_AFFECTED if (entry.module, entry.qualname) == (module, qualname)]


def site_key(site):
    return site.module, site.qualname


def site_keys():
    """Distinct (module, qualname) pairs, in table order."""
    seen = []
    for site in CALL_SITES:
        key = site_key(site)
        if key not in seen:
            seen.append(key)
    return seen


def rows_for(module, qualname=None):
    return [s for s in CALL_SITES if s.module == module and (qualname is None or s.qualname == qualname)]


def base_rows(site):
    """The rows whose method an inheriting row (``inherits`` set) inherits: same package, that qualname."""
    return [row for row in CALL_SITES
            if row.package == site.package and row.qualname == site.inherits and not row.inherits]


def module_names():
    """Modules the engine watches, in table order."""
    names = []
    for site in CALL_SITES:
        if site.module not in names:
            names.append(site.module)
    return names


def top_level_packages():
    """Top-level packages whose import arms the start-up watcher: every integration's ``PACKAGES``."""
    from . import integrations

    packages = set()
    for integration in integrations.load():
        packages.update(integration.PACKAGES)
    return frozenset(packages)
