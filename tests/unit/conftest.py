"""What every unit test starts from: the package's settings as this process's environment holds them.

The settings are read once per process (``tpu_closure_fix.settings.current``); a test that changes a
``TPU_CLOSURE_FIX*`` variable reads them again itself (``settings.reload()``). After each test they are read
again, once ``monkeypatch`` has put the environment back, so no test's values leak into the next.
"""
import pytest


def pytest_sessionstart(session):
    """The checkout compiled once for the children (:mod:`support.compiled`)."""
    from support.compiled import compile_checkout

    compile_checkout()


@pytest.fixture(autouse=True)
def _settings_as_the_environment_holds_them():
    yield
    from tpu_closure_fix import settings

    settings.reload()
