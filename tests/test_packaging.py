"""Packaging, checked against the code: what the code imports is what pyproject.toml
declares (runtime apart from dev), requirements.txt is the lock of exactly that list, and
the driver shipped to hosts needs nothing but the standard library and the bundled paho."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
RUNTIME = [Requirement(r) for r in PROJECT.get("dependencies", [])]
DEV = [Requirement(r) for r in PROJECT.get("optional-dependencies", {}).get("dev", [])]
CODE_DIRS = ("tasks", "sql", "dags", "spark")  # what runs in Airflow, its workers and Spark
# Our own top-level modules: the packages at the root, and the dags/ folder's modules
# (the dag-processor puts that folder on sys.path).
FIRST_PARTY = ({p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
               | {p.stem for p in (REPO / "dags").glob("*.py")})
DEV_TOOLS = {"pytest", "ruff"}


def imported_modules(paths: list[Path]) -> dict[str, set[str]]:
    """Dotted name -> files importing it. `from a.b import c` gives a.b.c (c may be a
    submodule; resolution falls back to a.b). Relative imports are our own, skipped."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def module_owners() -> dict[str, str]:
    """Dotted module name -> the installed distribution whose files hold it."""
    owners: dict[str, str] = {}
    for dist in distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or []:
            parts = file.parts
            if not parts or parts[0].endswith((".dist-info", ".data")) or ".." in parts:
                continue
            if file.suffix == ".py":
                stem = parts[:-1] if file.stem == "__init__" else (*parts[:-1], file.stem)
            elif file.suffix in (".so", ".pyd"):  # name.cpython-311-x86_64-linux-gnu.so
                stem = (*parts[:-1], file.name.split(".")[0])
            else:
                continue
            if stem:
                owners.setdefault(".".join(stem), name)
    return owners


def owner_of(dotted: str, owners: dict[str, str]) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):  # the longest prefix that is a module file
        if (owner := owners.get(".".join(parts[:end]))) is not None:
            return owner
    return None


def declared_distributions() -> set[str]:
    """[project].dependencies, plus what a declared meta-distribution (one that ships no
    module of its own, like apache-airflow) requires unconditionally: those are the
    distributions it exists to install."""
    owners = module_owners()
    shipping = set(owners.values())
    declared = {canonicalize_name(r.name) for r in RUNTIME}
    for dist in distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in declared and name not in shipping:
            declared |= {canonicalize_name(Requirement(r).name) for r in dist.requires or []
                         if Requirement(r).marker is None}
    return declared


def python_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (REPO / d).rglob("*.py"))


def test_every_third_party_import_comes_from_a_declared_runtime_dependency():
    owners = module_owners()
    declared = declared_distributions()
    undeclared = {}
    for dotted, files in imported_modules(python_files(*CODE_DIRS)).items():
        top = dotted.split(".")[0]
        if top in FIRST_PARTY or top in sys.stdlib_module_names:
            continue
        owner = owner_of(dotted, owners)
        if owner is None or owner not in declared:
            undeclared[dotted] = (owner, sorted(files))
    assert not undeclared, f"imported, not in [project].dependencies: {undeclared}"


def test_the_wheel_ships_every_first_party_module_its_code_imports():
    """tasks/ and sql/ go into the wheel; what they import of ours must be in it too."""
    shipped = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    for dotted, files in imported_modules(python_files("tasks", "sql")).items():
        top = dotted.split(".")[0]
        if top in FIRST_PARTY:
            assert top in shipped, (dotted, sorted(files))


def test_dev_tools_are_not_runtime_dependencies():
    runtime = {canonicalize_name(r.name) for r in RUNTIME}
    assert not runtime & DEV_TOOLS, runtime & DEV_TOOLS
    dev = {canonicalize_name(r.name): r for r in DEV}
    assert DEV_TOOLS <= set(dev), dev
    assert str(dev["ruff"].specifier).startswith("=="), "ruff is pinned: its findings change by version"


def test_requirements_txt_is_the_lock_of_pyproject():
    """One list: requirements.txt pins every declared runtime and dev dependency (as uv
    compiles it from pyproject.toml), and there is no second list of them."""
    assert not (REPO / "requirements.in").exists()
    lines = (REPO / "requirements.txt").read_text().splitlines()
    assert "pyproject.toml" in "\n".join(lines[:3]), lines[:3]
    pins = {}
    for line in lines:
        if line and not line[0].isspace() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(Requirement(name).name)] = version.split()[0]
    for requirement in RUNTIME + DEV:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is declared but not in the lock: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement} vs the lock's {pins[name]}: run `make lock`")


def test_the_driver_bundle_imports_with_the_standard_library_alone(tmp_path: Path):
    """Driver hosts have a bare Python: the bundle (tasks.driver and the pinned paho) must
    import every driver module with no site-packages at all (python -I -S)."""
    from tasks.bundle import build

    bundle = build(tmp_path)
    with zipfile.ZipFile(bundle) as archive:
        modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__")
                         for n in archive.namelist()
                         if n.startswith("tasks/driver/") and n.endswith(".py"))
    assert "tasks.driver.engine" in modules
    modules = [m for m in modules if not m.endswith("__main__")]
    code = (f"import sys; sys.path.insert(0, {str(bundle)!r}); import importlib; "
            f"[importlib.import_module(m) for m in {modules!r}]; import paho.mqtt.client; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) - set(sys.stdlib_module_names) - {"__main__"} == {
        "tasks", "paho"}

    # cut short (a full disk, a kill mid-write): built again, not shipped as it is
    whole = bundle.read_bytes()
    bundle.write_bytes(whole[: len(whole) // 2])
    assert build(tmp_path) == bundle and bundle.read_bytes() == whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
