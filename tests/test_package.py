"""The installable package (pyproject.toml): `reid` and `compat` import from any folder, the console commands
run outside the checkout with the configs that come with the package, the version has one home, every stack's
requirements file is an extra, and a wheel (`pip install .`) carries what the commands need."""
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.crossenv import ROOT

BIN = os.path.dirname(sys.executable)
# console command -> the script of a checkout that runs the same main()
COMMANDS = {"acl-reid-train": "train.py", "acl-reid-test": "test.py", "acl-reid-export": "tools/export.py",
            "acl-reid-convert": "tools/convert.py", "acl-reid-index": "tools/index.py",
            "acl-reid-search": "tools/search.py", "acl-reid-serve": "tools/serve.py",
            "acl-reid-sweep": "tools/sweep.py"}


def outside(args, cwd, env=None, timeout=300):
    """Run a command from `cwd` (outside the checkout) without PYTHONPATH: only the installed package counts."""
    env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
    return subprocess.run(args, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)


def installed():
    try:
        return importlib.metadata.distribution("acl-reid")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("the package is not installed in %s: run `make setup` (or pip install -e . there)" % sys.prefix)


def test_the_package_imports_from_any_folder_and_has_one_version(tmp_path):
    dist = installed()
    code = ("import reid, compat, acl_reid_tools.index; from reid.deploy import FeatureExtractor; "
            "print(reid.__file__); print(reid.__version__); print(FeatureExtractor.__module__)")
    proc = outside([sys.executable, "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, version, module = proc.stdout.split()
    assert where == str(ROOT / "reid" / "__init__.py")      # this checkout, installed editable
    assert module == "reid.deploy.extractor"
    assert version == dist.version                             # pyproject reads reid.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'version = {attr = "reid.__version__"}' in pyproject and not re.search(r'^version = "', pyproject, re.M)


def test_every_console_command_is_installed_and_matches_its_script():
    scripts = {ep.name: ep.value for ep in installed().entry_points if ep.group == "console_scripts"}
    assert set(scripts) == set(COMMANDS)
    tools = {"tools/%s" % name for name in os.listdir(str(ROOT / "tools")) if name.endswith(".py")}
    # tools/ holds the user's commands alone (the repros for the layer's developers are in repros/)
    assert tools == set(COMMANDS.values()) & tools
    for command, script in COMMANDS.items():
        assert os.access(os.path.join(BIN, command), os.X_OK), command
        module = scripts[command].split(":")[0]
        if script.startswith("tools/"):
            assert module == "acl_reid_tools." + script[len("tools/"):-3]
        else:
            assert module == "reid.cli." + script[:-3]
            assert "from %s import main" % module in (ROOT / script).read_text()


def test_a_command_runs_outside_the_checkout_with_a_shipped_config(tmp_path, synth_root):
    """acl-reid-test from an empty folder: configs/synthetic/acl.yml is not there, the package's is used."""
    out = tmp_path / "out"
    proc = outside([os.path.join(BIN, "acl-reid-test"), "--config-file", "configs/synthetic/acl.yml",
                    "--reference", "histogram", "DATASETS.ROOT", synth_root, "DATASETS.SYNTHETIC.NUM_IDS", "16",
                    "OUTPUT_DIR", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "colour histogram" in proc.stdout
    results = json.loads((out / "eval" / "results.json").read_text())
    assert "SynthD" in json.dumps(results)
    assert not (tmp_path / "configs").exists()
    missing = outside([os.path.join(BIN, "acl-reid-test"), "--config-file", "configs/no_such.yml"], tmp_path)
    assert missing.returncode != 0 and "configs/no_such.yml does not exist" in missing.stderr


def test_every_requirements_file_is_an_extra():
    extras = set(installed().metadata.get_all("Provides-Extra") or [])
    text = (ROOT / "pyproject.toml").read_text()
    declared = dict(re.findall(r'^optional-dependencies\.([\w-]+) = \{file = \["([^"]+)"\]\}', text, re.M))
    # a -nodeps file is installed with --no-deps beside its stack's file, which an extra cannot express
    assert sorted(declared.values()) == sorted(p.name for p in ROOT.glob("requirements*.txt")
                                               if not p.name.endswith("-nodeps.txt"))
    assert set(declared) <= extras


def test_a_wheel_carries_the_commands_code_and_configs(tmp_path):
    """`pip install .` (not editable): build the wheel, install it into a folder, import from there."""
    try:
        import setuptools
    except ImportError:
        setuptools = None
    if setuptools is None or int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("building needs setuptools >= 77 in this environment (the torch one has it); pip install . "
                    "gets it in an isolated build environment")
    wheels, target, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # built from a copy of what pyproject.toml packages (a build writes its build/ folder beside the sources)
    for folder in ("reid", "compat", "tools", "configs"):
        shutil.copytree(str(ROOT / folder), str(source / folder), ignore=shutil.ignore_patterns("__pycache__"))
    for path in [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "LICENSE"] + list(ROOT.glob("requirements*.txt")):
        shutil.copy(str(path), str(source))
    build = outside([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                     str(wheels), str(source)], tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(wheels.glob("acl_reid-*.whl"))
    done = outside([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    code = ("import reid, acl_reid_tools.search; from reid.config.config import find_config_file; "
            "print(reid.__file__); print(find_config_file('configs/synthetic/baseline.yml'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(target)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, config = proc.stdout.split()
    assert where == str(target / "reid" / "__init__.py")
    assert config == str(target / "reid" / "configs" / "synthetic" / "baseline.yml")
    assert (target / "reid" / "configs" / "Base-ACL.yml").exists()          # _BASE_ of the protocol configs
    assert (target / "reid" / "deploy" / "static" / "index.html").exists()  # the search server's page
    assert not (target / "tests").exists() and not (target / "bench").exists()
