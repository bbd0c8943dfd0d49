"""Packaging (issue 17): the core needs no extra, a missing extra is one line naming it, the
extras in pyproject.toml, and scripts/check_wheel.py (CI's check that the wheel holds every
tracked file of the package)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The harness's dependencies, blocked in a subprocess as if they were not installed.
HARNESS = ("yaml", "tqdm", "sklearn", "scipy")

_BLOCK = """
import importlib.abc
import sys

BLOCKED = {blocked!r}


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Block())
"""


def _run_blocked(body: str, blocked: tuple[str, ...] = HARNESS) -> dict:
    """Run ``body`` in a fresh interpreter where ``blocked`` cannot be imported; ``body`` sets
    ``out`` (a dict), printed back as JSON."""
    code = _BLOCK.format(blocked=blocked) + "out = {}\n" + textwrap.dedent(body)
    code += "\nimport json\nprint('RESULT ' + json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_import_vlret_pulls_in_no_harness_dependency():
    """Not blocked this time: installed, the harness's packages are still not imported."""
    code = "import sys, vlret; print([m for m in sys.modules if m.partition('.')[0] in %r])"
    proc = subprocess.run(
        [sys.executable, "-c", code % (("yaml", "sklearn", "scipy"),)],
        capture_output=True,
        text=True,
        check=True,
    )
    # tqdm is left out: torch.hub imports it when it is installed
    assert proc.stdout.strip() == "[]"


def test_the_core_and_every_module_but_semantic_import_without_the_harness_dependencies():
    """The core imports and runs with tqdm, PyYAML, scikit-learn and SciPy blocked, and pulls in
    none of them; then every module imports but vlret.semantic, which names its extra. A
    module-level ``import yaml`` anywhere (the command line imports the train, demo and data
    packages to build its parser) would break ``pip install vlret`` users."""
    out = _run_blocked(
        """
        import importlib
        import pkgutil
        import sys

        import torch

        import vlret
        import vlret.losses
        import vlret.memory
        import vlret.metrics
        import vlret.similarity
        from vlret._extras import MissingExtra

        img, txt = torch.randn(8, 16), torch.randn(8, 16)
        for name in ("triplet", "infonce", "unified"):
            loss = vlret.build_loss(name)(img, txt, img_ids=torch.arange(8))
            assert torch.isfinite(loss), name
        vlret.retrieval_metrics(img, txt, torch.arange(8))
        out["imported"] = sorted(
            m for m in sys.modules if m.partition(".")[0] in {"yaml", "tqdm", "sklearn", "scipy"}
        )

        failed, missing = {}, {}
        for info in pkgutil.walk_packages(vlret.__path__, "vlret."):
            if info.name == "vlret.__main__":
                continue
            try:
                importlib.import_module(info.name)
            except MissingExtra as err:
                missing[info.name] = str(err)
            except Exception as err:
                failed[info.name] = repr(err)
        out["failed"], out["missing"] = failed, missing
        """
    )
    assert out["imported"] == []
    assert out["failed"] == {}
    assert out["missing"] == {
        "vlret.semantic": (
            "vlret.semantic (VSL's caption TF-IDF) needs scikit-learn: pip install 'vlret[vsl]'"
        )
    }


def test_a_harness_call_names_the_extra(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("output_dir: x\n")
    out = _run_blocked(
        f"""
        import contextlib
        import io

        from vlret._extras import MissingExtra

        from vlret.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            out["train"] = main(["train", "vsepp_butd_f30k_unified"])
            out["compare"] = main(["compare", "synth_f30k_compare"])
        out["stderr"] = err.getvalue()

        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            out["configs"] = main(["configs"])  # no extra needed
        out["configs_out"] = stdout.getvalue()

        from vlret.run.config_files import read_config_file

        out["toml"] = sorted(read_config_file("src/vlret/configs/demo_tiny.toml"))
        try:
            read_config_file({str(cfg)!r})
        except MissingExtra as e:
            out["yaml"] = str(e)
        try:
            import vlret.semantic  # noqa: F401
        except ImportError as e:
            out["semantic"] = [type(e).__name__, str(e)]
        """
    )
    assert out["train"] == 2 and out["compare"] == 2
    assert out["stderr"].splitlines() == [
        "vlret train needs PyYAML: pip install 'vlret[train]'",
        "vlret compare needs PyYAML: pip install 'vlret[train]'",
    ]
    assert out["configs"] == 0 and "vsepp_butd_f30k_unified" in out["configs_out"]
    assert "data" in out["toml"]  # TOML needs no extra, YAML names it
    assert out["yaml"] == "a YAML run config needs PyYAML: pip install 'vlret[train]'"
    assert out["semantic"][0] == "MissingExtra"
    assert "pip install 'vlret[vsl]'" in out["semantic"][1]


def test_the_vsl_loss_in_the_cli_names_its_extra():
    """The quick demo fits VSL's TF-IDF: without scikit-learn it is one line naming vsl."""
    out = _run_blocked(
        """
        import contextlib
        import io

        from vlret.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            out["rc"] = main(["demo"])
        out["stderr"] = err.getvalue()
        """,
        blocked=("sklearn", "scipy"),
    )
    assert out["rc"] == 2
    assert out["stderr"] == "vlret demo needs scikit-learn: pip install 'vlret[vsl]'\n"


def test_yaml_configs_still_read_exponent_floats(tmp_path):
    """The lazily built YAML loader keeps reading ``1e-3`` (no dot) as a float."""
    from vlret.run.config_files import ConfigError, read_config_file

    cfg = tmp_path / "run.yaml"
    cfg.write_text("optim:\n  lr: 1e-3\n  other: 5E+4\n")
    assert read_config_file(cfg) == {"optim": {"lr": 1e-3, "other": 5e4}}
    cfg.write_text("optim: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        read_config_file(cfg)


# -- pyproject.toml -----------------------------------------------------------------------------


def _project() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_core_dependencies_are_torch_and_numpy():
    project = _project()["project"]
    assert _names(project["dependencies"]) == {"torch", "numpy", "tomli"}
    tomli = next(r for r in project["dependencies"] if r.startswith("tomli"))
    assert "python_version < '3.11'" in tomli  # the stdlib tomllib's backport only


def test_the_extras_carry_the_harness_and_dev_installs_them_all():
    extras = _project()["project"]["optional-dependencies"]
    assert _names(extras["train"]) == {"pyyaml", "tqdm"}
    assert _names(extras["vsl"]) == {"scikit-learn", "scipy"}
    others = sorted(set(extras) - {"all", "dev"})
    assert extras["all"] == [f"vlret[{','.join(['train', 'vsl', 'plot', 'hf', 'pixels', 'nltk'])}]"]
    assert set(others) == {"train", "vsl", "plot", "hf", "pixels", "nltk"}
    assert "vlret[all]" in extras["dev"]
    assert {"build", "twine", "pytest"} <= _names(extras["dev"])
    # every package an extra names is known to vlret._extras or imported lazily elsewhere
    from vlret._extras import EXTRAS

    assert {extra for _, extra in EXTRAS.values()} == {"train", "vsl", "hf", "plot", "pixels"}
    assert all(extra in extras for _, extra in EXTRAS.values())


def test_package_data_ships_the_configs_and_py_typed():
    data = _project()["tool"]["setuptools"]["package-data"]["vlret"]
    assert "configs/*.toml" in data and "py.typed" in data


# -- scripts/check_wheel.py --------------------------------------------------------------------


def _check_wheel():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_wheel
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return check_wheel


@pytest.fixture
def fake_repo(tmp_path):
    repo = tmp_path / "repo"
    files = ["src/vlret/__init__.py", "src/vlret/configs/a.toml", "src/vlret/py.typed"]
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text("x\n")
    (repo / "README.md").write_text("not packaged\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    return repo


def _wheel(path: Path, members: list[str]) -> Path:
    record = [f"{m},sha256=x,2" for m in members] + ["vlret-0.1.dist-info/RECORD,,"]
    with zipfile.ZipFile(path, "w") as zf:
        for m in members:
            zf.writestr(m, "x\n")
        zf.writestr("vlret-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_check_wheel_passes_a_complete_wheel(fake_repo, tmp_path, capsys):
    cw = _check_wheel()
    members = ["vlret/__init__.py", "vlret/configs/a.toml", "vlret/py.typed"]
    wheel = _wheel(tmp_path / "vlret-0.1-py3-none-any.whl", members)
    assert cw.main([str(wheel), "--repo", str(fake_repo)]) == 0
    assert "all 3 tracked files" in capsys.readouterr().out


def test_check_wheel_fails_listing_each_missing_file(fake_repo, tmp_path, capsys):
    cw = _check_wheel()
    wheel = _wheel(tmp_path / "vlret-0.1-py3-none-any.whl", ["vlret/__init__.py"])
    assert cw.main([str(wheel), "--repo", str(fake_repo)]) == 1
    err = capsys.readouterr().err
    assert "missing from the wheel vlret-0.1-py3-none-any.whl: vlret/configs/a.toml" in err
    assert "missing from the wheel vlret-0.1-py3-none-any.whl: vlret/py.typed" in err
    assert "FAILED, 2 problem(s)" in err


def test_check_wheel_fails_a_file_left_out_of_record(fake_repo, tmp_path, capsys):
    cw = _check_wheel()
    members = ["vlret/__init__.py", "vlret/configs/a.toml", "vlret/py.typed"]
    wheel = tmp_path / "vlret-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for m in members:
            zf.writestr(m, "x\n")
        zf.writestr("vlret-0.1.dist-info/RECORD", "vlret/__init__.py,,\n")
    assert cw.main([str(wheel), "--repo", str(fake_repo)]) == 1
    err = capsys.readouterr().err
    assert "missing from the wheel's RECORD: vlret/configs/a.toml" in err


def test_check_wheel_checks_the_sdist_too(fake_repo, tmp_path, capsys):
    import tarfile

    cw = _check_wheel()
    members = ["vlret/__init__.py", "vlret/configs/a.toml", "vlret/py.typed"]
    wheel = _wheel(tmp_path / "vlret-0.1-py3-none-any.whl", members)
    sdist = tmp_path / "vlret-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for f in ("src/vlret/__init__.py", "src/vlret/py.typed"):
            tf.add(fake_repo / f, arcname=f"vlret-0.1/{f}")
    assert cw.main([str(wheel), "--sdist", str(sdist), "--repo", str(fake_repo)]) == 1
    assert "missing from the sdist vlret-0.1.tar.gz: src/vlret/configs/a.toml" in (
        capsys.readouterr().err
    )
