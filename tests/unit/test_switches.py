"""The two finer switches, each with its twin: TPU_CLOSURE_FIX_LOG and TPU_CLOSURE_FIX_DISABLE.

* ``TPU_CLOSURE_FIX_LOG=debug|info|warning|error``: the level of the ``tpu_closure_fix`` logger and one
  stderr handler, applied on import (children started as a user would: ``python -c 'import
  tpu_closure_fix'``, the installed .pth included); unset: nothing printed; a bad value: one warning.
  stdout stays empty at start in every case.
* ``TPU_CLOSURE_FIX_DISABLE=accelerate,optimum_neuron``: those integrations' sites are ``disabled``
  (engine._decide's rule 13) while another integration's site in the same process is patched; an
  unknown name warns once, naming the accepted names. In-process, on sites of this test's own (no
  framework is installed in the unit lane): the call-site table is replaced by rows of the real
  integration names over small modules, and the engine's state by a fresh one, for each test.
"""
import logging
import os
import subprocess
import sys
import types
import warnings

import pytest

from support.switch_warnings import assert_bad_value_lines
from support.xla_model_source import xla_model_source
from tpu_closure_fix import activation, config, engine, fixes, integrations, report, settings, sites
from tpu_closure_fix.shape import Shape

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- TPU_CLOSURE_FIX_LOG: parsing
@pytest.mark.parametrize("raw,level", [("debug", logging.DEBUG), (" INFO\n", logging.INFO),
                                       ("Warning", logging.WARNING), ("\tERROR ", logging.ERROR),
                                       (None, None), ("", None), (" \t", None)])
def test_log_levels(raw, level):
    assert settings.parse_log_level(raw) == (level, None)


@pytest.mark.parametrize("raw", ["verbose", "warn", "10", "critical", "debug,info", "debug\u2003",
                                 "\uff24\uff25\uff22\uff35\uff27", "x" * 100])
def test_a_bad_log_level_names_the_variable_the_value_and_the_accepted_values(raw):
    level, problem = settings.parse_log_level(raw)
    assert level is None
    assert problem.split("\n")[1].startswith(
        "    TPU_CLOSURE_FIX_LOG=%s is not an accepted value" % config.quote_value(raw))
    assert "accepted: debug/info/warning/error" in problem
    assert "`unset TPU_CLOSURE_FIX_LOG`" in problem  # a next step that works
    assert_bad_value_lines(problem)


# --------------------------------------------------------------------------- TPU_CLOSURE_FIX_DISABLE: parsing
@pytest.mark.parametrize("raw,named", [
    ("accelerate", {"accelerate"}),
    (" Accelerate , optimum-neuron ", {"accelerate", "optimum_neuron"}),
    ("OPTIMUM_NEURON", {"optimum_neuron"}),
    ("Optimum-Neuron,torch-xla", {"optimum_neuron", "torch_xla"}),
    ("lightning,,\n", {"lightning"}),
    ("lightning,accelerate,optimum_neuron,torch_xla", set(integrations.NAMES)),
    ("", set()), (" , ", set()), (None, set()),
])
def test_disable_names_integrations_as_the_code_knows_them(raw, named):
    assert settings.parse_disable(raw, integrations.NAMES) == (frozenset(named), None)


@pytest.mark.parametrize("raw,named,unknown", [
    ("accelerate, bogus", {"accelerate"}, ["'bogus'"]),
    ("accelerat", set(), ["'accelerat'"]),  # a prefix, a longer name, another spelling: never a match
    ("accelerates", set(), ["'accelerates'"]),
    ("optimum neuron,optimum", set(), ["'optimum neuron'", "'optimum'"]),
    ("pytorch_lightning, torch_xla2", set(), ["'pytorch_lightning'", "'torch_xla2'"]),
    ("torch.xla", set(), ["'torch.xla'"]),
    ("\uff41ccelerate,lightning", {"lightning"}, ["'\\uff41ccelerate'"]),
])
def test_an_unknown_name_is_named_with_the_accepted_names_and_the_known_ones_apply(raw, named, unknown):
    disabled, problem = settings.parse_disable(raw, integrations.NAMES)
    assert disabled == frozenset(named)
    assert problem.split("\n")[1].startswith("    TPU_CLOSURE_FIX_DISABLE=%s names no integration %s;"
                                             % (config.quote_value(raw), ", ".join(unknown)))
    assert "accepted: lightning, accelerate, optimum_neuron, torch_xla" in " ".join(problem.split())
    # the next step keeps what applies: the known names, else nothing
    kept = ",".join(name for name in integrations.NAMES if name in named)
    assert ("`export TPU_CLOSURE_FIX_DISABLE=%s`" % kept if kept else "`unset TPU_CLOSURE_FIX_DISABLE`") in problem
    assert_bad_value_lines(problem)


@pytest.mark.parametrize("variable,read,bad", [
    ("TPU_CLOSURE_FIX_LOG", lambda environ: settings.of(environ).get(config.LOG_VAR), "loud"),
    ("TPU_CLOSURE_FIX_DISABLE", lambda environ: settings.of(environ).get(config.DISABLE_VAR), "bogus"),
])
def test_a_bad_value_warns_once_per_distinct_value(variable, read, bad, monkeypatch):
    monkeypatch.setattr(settings, "_said", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for raw in (bad, bad, bad + "2", bad + "2", "", None):
            read({} if raw is None else {variable: raw})
    assert [w.category for w in seen] == [config.TPUClosureFixWarning] * 2
    assert [variable + "='%s'" % value in str(w.message) for w, value in zip(seen, (bad, bad + "2"))] == [True] * 2


# --------------------------------------------------------------------------- TPU_CLOSURE_FIX_LOG: the hook
@pytest.fixture
def logger():
    """A private logger, so the hook is tried without touching the package's own."""
    private = logging.getLogger("tpu_closure_fix_test_switches_%d" % id(object()))
    yield private
    private.handlers[:] = []


def test_the_log_hook_sets_the_level_and_adds_one_stderr_handler(logger, capsys, monkeypatch):
    monkeypatch.setattr(logging.root, "handlers", [])  # no logging configured (pytest's own capture taken out)
    for _ in range(3):  # import, reload, another activation: one handler
        assert activation.configure_logging({"TPU_CLOSURE_FIX_LOG": "Debug"}, logger) == logging.DEBUG
    assert logger.level == logging.DEBUG
    assert [h.name for h in logger.handlers] == [activation.HANDLER_NAME]
    assert isinstance(logger.handlers[0], logging.StreamHandler)
    logger.debug("a message")
    out, err = capsys.readouterr()  # the stream is sys.stderr as it is now: pytest's capture
    assert out == "" and err == "DEBUG:%s:a message\n" % logger.name
    assert activation.configure_logging({"TPU_CLOSURE_FIX_LOG": "error"}, logger) == logging.ERROR
    assert logger.level == logging.ERROR and len(logger.handlers) == 1


def test_twin_where_the_program_configured_logging_its_handlers_say_it_once_the_hook_stays_silent(
        logger, capsys, monkeypatch):
    import io

    configured = io.StringIO()
    monkeypatch.setattr(logging.root, "handlers", [logging.StreamHandler(configured)])
    activation.configure_logging({"TPU_CLOSURE_FIX_LOG": "info"}, logger)
    logger.info("a message")
    assert capsys.readouterr().err == "" and configured.getvalue() == "a message\n"


@pytest.mark.parametrize("environ", [{}, {"TPU_CLOSURE_FIX_LOG": ""}, {"TPU_CLOSURE_FIX_LOG": " "}])
def test_unset_the_log_hook_changes_nothing(logger, environ):
    logger.setLevel(logging.WARNING)
    assert activation.configure_logging(environ, logger) is None
    assert logger.level == logging.WARNING and logger.handlers == []


def test_a_bad_log_level_changes_nothing_and_warns(logger, monkeypatch):
    monkeypatch.setattr(settings, "_said", set())
    logger.setLevel(logging.WARNING)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert activation.configure_logging({"TPU_CLOSURE_FIX_LOG": "loud"}, logger) is None
    assert logger.level == logging.WARNING and logger.handlers == []
    assert [w.category for w in seen] == [config.TPUClosureFixWarning]


# --------------------------------------------------------------------------- TPU_CLOSURE_FIX_LOG: a child
def run_child(code, flags=(), **switches):
    """``python [flags] -c code`` as a user runs it (the installed .pth included; this working tree's package
    and start-up module first on the path), every inherited TPU_CLOSURE_FIX* variable removed, ``switches``
    set."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPU_CLOSURE_FIX")}
    env.pop("PYTHONWARNINGS", None)
    env["PYTHONPATH"] = os.pathsep.join((REPO, os.path.join(REPO, "startup")))
    env.update(switches)
    return subprocess.run([sys.executable] + list(flags) + ["-c", code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


ENABLED_LINE = "DEBUG:tpu_closure_fix:tpu-closure-fix: enabled; watching "


def test_log_debug_shows_the_engine_debug_message_on_stderr():
    proc = run_child("import tpu_closure_fix", TPU_CLOSURE_FIX_LOG="debug")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count(ENABLED_LINE) == 1, proc.stderr
    assert "integrations switched off: none" in proc.stderr


@pytest.mark.parametrize("switches", [{}, {"TPU_CLOSURE_FIX_LOG": ""}, {"TPU_CLOSURE_FIX_LOG": "error"}],
                         ids=["unset", "empty", "error"])
def test_twin_without_log_debug_nothing_is_printed(switches):
    proc = run_child("import tpu_closure_fix; tpu_closure_fix.enable()", **switches)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("", "")


def test_one_handler_across_reimports_and_enable_calls():
    code = ("import importlib, logging, tpu_closure_fix\n"
            "importlib.reload(tpu_closure_fix)\n"
            "tpu_closure_fix.enable(); tpu_closure_fix.enable()\n"
            "tpu_closure_fix.activation.activate()\n"
            "logging.getLogger('tpu_closure_fix.synccheck').info('from a child logger')\n")
    proc = run_child(code, TPU_CLOSURE_FIX_LOG=" INFO ")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == "INFO:tpu_closure_fix.synccheck:from a child logger\n"  # info: no debug line


def test_a_bad_log_value_warns_once_naming_the_accepted_values():
    code = ("import importlib, tpu_closure_fix\n"
            "importlib.reload(tpu_closure_fix)\n"
            "tpu_closure_fix.activation.activate()\n")
    proc = run_child(code, flags=["-W", "always"], TPU_CLOSURE_FIX_LOG="loud")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("TPUClosureFixWarning") == 1, proc.stderr
    assert "TPU_CLOSURE_FIX_LOG='loud' is not an accepted value; accepted: debug/info/warning/error" in proc.stderr
    assert "DEBUG" not in proc.stderr


def test_a_bad_disable_value_warns_once_at_start_and_prints_nothing_on_stdout():
    proc = run_child("import tpu_closure_fix; tpu_closure_fix.enable()", flags=["-W", "always"],
                     TPU_CLOSURE_FIX_DISABLE="accelerate,bogus", TPU_CLOSURE_FIX_LOG="debug")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("TPUClosureFixWarning") == 1, proc.stderr
    assert "names no integration 'bogus'; accepted: lightning, accelerate, optimum_neuron, torch_xla" in " ".join(
        proc.stderr.split())  # wrapped at 120 columns
    assert proc.stderr.count(ENABLED_LINE) == 2 and "integrations switched off: accelerate" in proc.stderr


# --------------------------------------------------------------------------- TPU_CLOSURE_FIX_DISABLE: the engine
class _Fix(fixes.Fix):
    """Marks what it returns, so a call shows whether the patched code ran."""

    name = "test-switches"

    def describe(self):
        return "returns ('fixed', the original's result)"

    def prepare(self, site, original, switch):
        def wrapper(wrapped, instance, args, kwargs):
            result = wrapped(*args, **kwargs)
            return ("fixed", result) if switch.on else result

        return wrapper


STEP = Shape(("closure",), varkw=False, requires=("optimizer_step", "optimizer_args", "closure"))
#: A shape the code does not have: the site is skipped (and guarded when its call reaches the guard).
OTHER_STEP = Shape(("closure",), varkw=False, requires=("closure", "a_name_the_code_lacks"))

SOURCE = '''
class Optimizer(object):
    optimizer = None

    def step(self, closure=None):
        xm.optimizer_step(self.optimizer, optimizer_args={"closure": closure})
        return "original"
'''

#: torch_xla's xla_model whose reduce_gradients and mark_step append their names to the module's ``calls``.
XLA_MODEL = xla_model_source(on_reduce='calls.append("reduce_gradients")', on_mark_step='calls.append("mark_step")')

#: The sites of the tests' table: (integration, top-level package, shape).
OWN_SITES = {"accelerate": ("tcf_switches_accelerate", STEP), "optimum_neuron": ("tcf_switches_neuron", STEP),
             "lightning": ("tcf_switches_lightning", OTHER_STEP)}
GUARD_KEY = ("torch_xla.core.xla_model", "optimizer_step")


class Table(object):
    """The tests' call-site table over modules of their own, with a fresh engine state."""

    def __init__(self, monkeypatch, names, guard):
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(engine, "_state", engine._State())
        monkeypatch.setattr(engine, "_arm_for_reload", lambda name: None)  # no wrapt hook left for these names
        monkeypatch.setattr(settings, "_said", set())
        xm = self._xla_model() if guard else types.SimpleNamespace(optimizer_step=lambda *args, **kwargs: None)
        rows, self.keys = [], {}
        if guard:
            rows.extend(sites.rows_for(*GUARD_KEY))  # the real torch_xla row, over this test's xla_model
            self.keys["torch_xla"] = GUARD_KEY
        for name in names:
            top, shape = OWN_SITES[name]
            self._module(top, "1.0.0")
            module = self._module(top + ".optimizer", None, xm=xm)
            exec(SOURCE, module.__dict__)
            rows.append(sites.make_site("%s-test" % name, name, top, top, module.__name__, "Optimizer.step",
                                        ">=1.0,<2", shape, _Fix()))
            self.keys[name] = (module.__name__, "Optimizer.step")
        monkeypatch.setattr(sites, "CALL_SITES", tuple(rows))

    def _module(self, name, release, **attributes):
        module = types.ModuleType(name)
        module.__path__ = []
        if release:
            module.__version__ = release
        vars(module).update(attributes)
        self.monkeypatch.setitem(sys.modules, name, module)
        return module

    def _xla_model(self):
        self._module("torch_xla", "2.5.0")
        self._module("torch_xla.core", None)
        xm = self._module("torch_xla.core.xla_model", None, calls=[])
        exec(XLA_MODEL, xm.__dict__)
        sys.modules["torch_xla"].core = sys.modules["torch_xla.core"]
        sys.modules["torch_xla.core"].xla_model = xm
        return xm

    def enable(self, disable=None):
        """engine.enable() under TPU_CLOSURE_FIX_DISABLE=disable; returns the TPUClosureFixWarnings' texts."""
        if disable is None:
            self.monkeypatch.delenv("TPU_CLOSURE_FIX_DISABLE", raising=False)
        else:
            self.monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", disable)
        settings.reload()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert engine.enable() is True
        return [str(w.message) for w in seen if w.category is config.TPUClosureFixWarning]

    def verdict(self, name):
        finding = engine.examine(self.keys[name])
        return finding.verdict, finding.reason

    def records(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            keys = {key: name for name, key in self.keys.items()}
            return {keys[(r["module"], r["method"])]: r for r in report.status()}

    def call(self, name):
        return sys.modules[self.keys[name][0]].Optimizer().step(closure=lambda: None)


@pytest.fixture
def table(monkeypatch):
    yield lambda names, guard=False: Table(monkeypatch, names, guard)
    engine._state.switch.on = False  # the fresh state's wrappers (on this test's classes) pass through


@pytest.mark.parametrize("disable,off,on", [
    ("accelerate", "accelerate", "optimum_neuron"),
    ("optimum_neuron", "optimum_neuron", "accelerate"),
    (" Optimum-Neuron ", "optimum_neuron", "accelerate"),  # the distribution's spelling, any case
    ("ACCELERATE,", "accelerate", "optimum_neuron"),
])
def test_disable_leaves_that_integration_alone_and_patches_the_other(table, disable, off, on):
    t = table(["accelerate", "optimum_neuron"])
    assert t.enable(disable) == []
    assert t.verdict(off) == (engine.DISABLED, "TPU_CLOSURE_FIX_DISABLE names %s" % off)
    assert t.verdict(on) == (engine.PATCHED, "")
    assert t.call(off) == "original" and t.call(on) == ("fixed", "original")  # what runs, not only what is said
    records = t.records()
    assert (records[off]["verdict"], records[off]["reason"], records[off]["integration"]) == (
        "disabled", "TPU_CLOSURE_FIX_DISABLE names %s" % off, off)
    assert (records[on]["verdict"], records[on]["integration"]) == ("patched", on)


@pytest.mark.parametrize("disable", [None, "", " , "], ids=["unset", "empty", "only-commas"])
def test_twin_without_disable_both_integrations_are_patched(table, disable):
    t = table(["accelerate", "optimum_neuron"])
    assert t.enable(disable) == []
    assert t.verdict("accelerate") == t.verdict("optimum_neuron") == (engine.PATCHED, "")
    assert t.call("accelerate") == t.call("optimum_neuron") == ("fixed", "original")


def test_an_unknown_name_warns_once_and_the_known_ones_still_apply(table):
    t = table(["accelerate", "optimum_neuron"])
    (message,) = t.enable("accelerate, bogus")
    assert " ".join(message.split()).startswith("TPU_CLOSURE_FIX_DISABLE='accelerate, bogus' names no integration "
                                                "'bogus'; accepted: lightning, accelerate, optimum_neuron, torch_xla")
    assert t.verdict("accelerate") == (engine.DISABLED, "TPU_CLOSURE_FIX_DISABLE names accelerate")
    assert t.verdict("optimum_neuron") == (engine.PATCHED, "")
    assert t.enable("accelerate, bogus") == []  # enable() again: the same value, no second warning


def test_enable_uses_the_settings_read_once_and_a_reload_reads_the_variable_again(table):
    t = table(["accelerate", "optimum_neuron"])
    t.enable("accelerate")
    engine.disable()
    t.monkeypatch.delenv("TPU_CLOSURE_FIX_DISABLE")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert engine.enable() is True  # the environment changed; the settings, read once, did not
    assert t.verdict("accelerate") == (engine.DISABLED, "TPU_CLOSURE_FIX_DISABLE names accelerate")
    engine.disable()
    t.enable(None)  # read again without the variable: accelerate is patched now
    assert t.verdict("accelerate") == t.verdict("optimum_neuron") == (engine.PATCHED, "")
    engine.disable()
    t.enable("optimum-neuron")
    assert t.verdict("optimum_neuron") == (engine.DISABLED, "TPU_CLOSURE_FIX_DISABLE names optimum_neuron")
    assert t.verdict("accelerate") == (engine.PATCHED, "")


def test_the_global_switch_still_wins(table):
    """TPU_CLOSURE_FIX=0 (the shim never enabled): every site says so, whatever TPU_CLOSURE_FIX_DISABLE names."""
    t = table(["accelerate", "optimum_neuron"])
    t.monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", "accelerate")
    settings.reload()
    engine.set_disabled_reason("TPU_CLOSURE_FIX=0")
    assert t.verdict("accelerate") == t.verdict("optimum_neuron") == (engine.DISABLED, "TPU_CLOSURE_FIX=0")


def test_a_disabled_integrations_skipped_site_is_not_warned_about(table):
    t = table(["lightning"])  # its code is not the row's shape: skipped
    assert t.enable("lightning") == []
    assert t.verdict("lightning")[0] == engine.SKIPPED  # what the code is, as under TPU_CLOSURE_FIX=0
    t = table(["lightning"])  # the twin: the integration on, the skipped site is warned about
    (message,) = t.enable(None)
    assert "not patched: unexpected code shape" in message


@pytest.mark.parametrize("disable,expected", [
    # torch_xla (the guard), accelerate (its shape: patched), lightning (not its shape: skipped)
    (None, {"torch_xla": "patched", "accelerate": "patched", "lightning": "guarded"}),
    ("torch_xla", {"torch_xla": "disabled", "accelerate": "patched", "lightning": "skipped"}),
    ("accelerate", {"torch_xla": "patched", "accelerate": "guarded", "lightning": "guarded"}),
    ("accelerate,torch-xla", {"torch_xla": "disabled", "accelerate": "disabled", "lightning": "skipped"}),
])
def test_the_torch_xla_guard_can_be_disabled_too(table, disable, expected):
    t = table(["accelerate", "lightning"], guard=True)
    t.enable(disable)
    verdicts = {name: t.verdict(name) for name in expected}
    assert {name: verdict for name, (verdict, _) in verdicts.items()} == expected
    for name in ("torch_xla", "accelerate"):
        if expected[name] == "disabled":
            assert verdicts[name][1] == "TPU_CLOSURE_FIX_DISABLE names %s" % name
    if expected["accelerate"] == "guarded":  # switched off, but its call reaches the guard: said, and so it runs
        assert verdicts["accelerate"][1] == ("TPU_CLOSURE_FIX_DISABLE names accelerate; its call goes through the "
                                             "patched torch_xla guard")
        xm = sys.modules["torch_xla.core.xla_model"]

        class Optimizer(object):
            def step(self, closure=None):
                xm.calls.append("step")
                closure()

        instance = sys.modules[t.keys["accelerate"][0]].Optimizer()
        instance.optimizer = Optimizer()
        assert instance.step(closure=lambda: xm.calls.append("closure")) == "original"
        assert xm.calls == ["step", "closure", "reduce_gradients"]


def test_every_status_record_names_its_integration():
    records = report.status()
    assert records and all(r["integration"] in integrations.NAMES for r in records)
    assert {r["integration"] for r in records} == set(integrations.NAMES)
    from tpu_closure_fix.outcome import records as outcome_records

    assert set(outcome_records.FIELDS) == set(records[0])


def test_the_package_logger_gets_no_handler_without_the_variable():
    """In this process (TPU_CLOSURE_FIX_LOG unset when it imported the package): only the NullHandler."""
    if os.environ.get("TPU_CLOSURE_FIX_LOG"):
        pytest.skip("TPU_CLOSURE_FIX_LOG is set for this run")
    handlers = logging.getLogger("tpu_closure_fix").handlers
    assert handlers and all(isinstance(h, logging.NullHandler) for h in handlers)
    assert activation.configure_logging() is None
    assert logging.getLogger("tpu_closure_fix").handlers == handlers
