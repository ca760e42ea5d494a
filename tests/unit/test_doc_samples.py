"""The sample outputs in docs/ are what the code prints today (scripts/doc_samples.py regenerates them)."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    spec = importlib.util.spec_from_file_location("doc_samples_under_test", os.path.join(REPO, "scripts",
                                                                                          "doc_samples.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_sample_in_the_docs_is_up_to_date(capsys):
    assert _script().main(["--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", ["demo", "compiled-only", "matrix", "settings"])
def test_a_sample_that_differs_from_the_code_is_found(name, tmp_path, monkeypatch, capsys):
    script = _script()
    document, render = script.SAMPLES[name]
    copy = tmp_path / os.path.basename(document)
    with open(os.path.join(REPO, document), encoding="utf-8") as handle:
        copy.write_text(handle.read().replace(render().split("\n")[-1], "a stale line"), encoding="utf-8")
    monkeypatch.setitem(script.SAMPLES, name, (str(copy), render))
    assert script.main(["--check"]) == 1
    assert "out of date: %s" % name in capsys.readouterr().err


def test_the_demo_sample_shows_what_the_run_measured():
    """The docs' numbers: SyncCheck warned from step 1 on without the shim, and stayed silent with it."""
    text = _script().demo_sample()
    assert "warned at step 1, 20, 40, ..." in text and "silent (12 checks)" in text, text
    assert all(len(line) <= 120 for line in text.split("\n"))


def test_the_settings_list_has_one_item_per_row_of_the_table():
    """docs/settings.md's list of the settings is the package's table: each variable once, with its accepted values."""
    from tpu_closure_fix import settings

    text = _script().settings_sample()
    items = [line for line in text.split("\n") if line.startswith("* ")]
    assert [item.split("`")[1] for item in items] == [row.name for row in settings.TABLE]
    flat = " ".join(text.split())
    assert all(row.accepted in flat for row in settings.TABLE)
    with open(os.path.join(REPO, "docs", "settings.md"), encoding="utf-8") as handle:
        assert text in handle.read()
