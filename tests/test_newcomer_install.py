"""What a new user meets on a fresh clone: the install, the imports, pytest's own output."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "indexer"


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _run(args, cwd, env=None, timeout=300):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=full_env)


def test_editable_install_is_a_path_entry_not_a_late_import_hook(tmp_path):
    # setuptools' default editable install of a flat layout is an import hook appended to
    # sys.meta_path: it runs after the path search, which takes a folder named `indexer` in
    # the working directory (the clone itself, seen from its parent) for a namespace package
    # first. A .pth path entry puts the repository root on sys.path, where the regular
    # package wins over any namespace folder.
    code = ("import sys; from setuptools import build_meta as b; "
            f"print(b.build_editable({str(tmp_path)!r}))")
    res = _run(["-c", code], cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    wheel = tmp_path / res.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert not [n for n in names if n.endswith("_finder.py")], names
        (pth,) = [n for n in names if n.endswith(".pth")]
        entries = z.read(pth).decode().split()
    assert [Path(e).resolve() for e in entries] == [ROOT], entries


def test_cli_runs_from_the_folder_that_holds_the_clone(tmp_path):
    # `git clone <url> indexer` in tmp_path, then `python -m indexer info` without cd-ing in
    clone = tmp_path / "indexer"
    clone.mkdir()
    (clone / "pyproject.toml").write_text("")
    res = _run(["-m", "indexer", "info"], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "indexer 0." in res.stdout and "platform:" in res.stdout


def test_a_shadowed_package_is_one_clear_line(tmp_path):
    # what an install made before the fix shows: `indexer` is the clone's folder as an empty
    # namespace package, while `indexer.cli` still comes from the real package
    code = (
        "import sys, types\n"
        "ns = types.ModuleType('indexer')\n"
        f"ns.__path__ = [{str(PACKAGE)!r}]\n"
        "ns.__file__ = None\n"
        "sys.modules['indexer'] = ns\n"
        "from indexer.cli import main\n"
        "sys.exit(main(['info']))\n"
    )
    res = _run(["-c", code], cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "shadows the indexer package" in lines[0] and "repository root" in lines[0]


def test_base_install_brings_numpy():
    deps = _pyproject()["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in deps), deps


def test_import_prints_no_numpy_warning():
    res = _run(["-c", "import indexer, torch; torch.zeros(1).numpy()"], cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Failed to initialize NumPy" not in res.stderr, res.stderr


def test_plot_extra_installs_matplotlib():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert "matplotlib" in extras["plot"]


def test_pytest_prints_skip_reasons_and_still_lists_failures(tmp_path):
    addopts = _pyproject()["tool"]["pytest"]["ini_options"]["addopts"].split()
    (chars,) = [a[2:] for a in addopts if a.startswith("-r")]
    assert set(chars) >= set("fEs"), addopts  # -r replaces pytest's default fE: keep those
    test = tmp_path / "test_skipping.py"
    test.write_text("import pytest\n\n@pytest.mark.skip(reason='needs a teapot')\ndef test_x():\n    pass\n\n"
                    "def test_y():\n    assert 0\n")
    res = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
                "--rootdir", str(tmp_path), str(test)], cwd=tmp_path, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    summary = res.stdout[res.stdout.index("short test summary info"):]
    assert "SKIPPED [1]" in summary and "needs a teapot" in summary, res.stdout
    assert "FAILED" in summary and "test_y" in summary, res.stdout
