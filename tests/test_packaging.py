"""A non-editable install (`pip install .`, the README's first command) ships every
Python package of the tree: pyproject.toml lists packages by hand (the frontends/
and datalog/ folders are mapped into dlverify.*), so a new subpackage missing from
the list would install a dlverify that fails at its first import of it."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_installed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = cfg["package-dir"]
    for name in listed:
        folder = ROOT / dirs.get(name, name.replace(".", "/"))
        assert (folder / "__init__.py").is_file(), f"{name}: no package at {folder}"
    for top, pkg in (("dlverify", "dlverify"), ("frontends", "dlverify.frontends"),
                     ("datalog", "dlverify.datalog")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            name = ".".join([pkg, *rel.parts])
            assert name in listed, f"{init.parent} is not listed in pyproject.toml's packages"
            assert dirs.get(name, name.replace(".", "/")) == str(init.parent.relative_to(ROOT)), \
                f"{name} maps to the wrong folder"
