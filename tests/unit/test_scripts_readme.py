"""scripts/README.md says what every file in scripts/ is for."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "scripts")


def undocumented(readme, names):
    """The names that no list item of ``readme`` starts by naming (`name`, then a dash or its arguments)."""
    items = [line.split("`")[1] for line in readme.splitlines() if line.startswith(("* `", "Not in CI: `"))
             and line.count("`") >= 2]
    named = {item.split()[0] for item in items} | {name for name in names if "`%s`" % name in readme}
    return sorted(name for name in names if name not in named)


def test_every_script_is_described():
    names = [name for name in os.listdir(SCRIPTS) if name != "README.md" and not name.startswith((".", "__"))]
    with open(os.path.join(SCRIPTS, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    assert len(names) >= 18
    assert not undocumented(readme, names), undocumented(readme, names)


def test_a_script_the_readme_does_not_name_is_found():
    assert undocumented("* `a.sh` — does a\n", ["a.sh", "b.py"]) == ["b.py"]
