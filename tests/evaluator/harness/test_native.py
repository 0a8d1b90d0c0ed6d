"""The compiled build of the harness's hot modules (``evaluator.harness.native``).

``make install`` builds it; these tests need that build (in CI a missing build is a failure, not
a skip) and check that the harness command uses it, that it decides exactly as the Python modules
do, and that a build which no longer matches the sources is never used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evaluator.harness import native

from .conftest import EVIDENCE, PROJECT_ROOT


@pytest.fixture(scope="module")
def current_build() -> Path:
    stale = native.stale_modules()
    if stale:
        pytest.skip(f"no compiled build matching the sources (make install builds it): {stale}")
    return native.DEFAULT_BUILD_DIR


def _harness(*args: str, tmp_path: Path, name: str) -> tuple[dict, str]:
    output = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "evaluator.harness", *args, "--output", str(output)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(output.read_text(encoding="utf-8")), done.stdout


@pytest.mark.parametrize("target", ["admission-controller", "evaluator"])
def test_the_command_runs_the_compiled_modules_and_they_decide_as_python(
    current_build, tmp_path, target
):
    manifest = "manifests/load-manifest.v2.json"
    compiled, compiled_summary = _harness(
        "--manifest", manifest, "--target", target, tmp_path=tmp_path, name="compiled"
    )
    python, python_summary = _harness(
        "--manifest", manifest, "--target", target, "--pure", tmp_path=tmp_path, name="python"
    )
    assert "admission core: compiled (mypyc)" in compiled_summary
    assert "admission core: Python" in python_summary
    assert compiled["observations"] == python["observations"]
    retained = json.loads((EVIDENCE / f"{target}.json").read_text(encoding="utf-8"))
    assert compiled["observations"] == retained["observations"]
    assert compiled["passed"] is python["passed"] is True


def _activation(build_dir: Path, root: Path) -> tuple[bool, str]:
    # A fresh interpreter: activation must come before anything imports the core.
    program = (
        "import sys; from pathlib import Path\n"
        "from evaluator.harness.native import activate\n"
        "used = activate(Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "import admission.core.controller as controller\n"
        "print(used, controller.__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(build_dir), str(root)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    used, path = done.stdout.split()
    return used == "True", path


def _copy_sources(root: Path) -> None:
    for module in native.COMPILED_MODULES:
        relative = Path(*module.split(".")).with_suffix(".py")
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT_ROOT / relative, root / relative)


def test_a_matching_build_serves_every_compiled_module(current_build):
    used, path = _activation(current_build, PROJECT_ROOT)
    assert used is True
    assert path.startswith(str(current_build))
    assert path.endswith(native._extension_suffix())


def test_an_edited_source_keeps_the_whole_build_out(current_build, tmp_path):
    root = tmp_path / "sources"
    _copy_sources(root)
    assert native.stale_modules(current_build, root) == []
    rules = root / "admission" / "core" / "rules.py"
    rules.write_text(rules.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert native.stale_modules(current_build, root) == ["admission.core.rules"]
    used, path = _activation(current_build, root)
    assert used is False
    # Not even the unchanged modules: the compiled ones call each other directly.
    assert path == str(PROJECT_ROOT / "admission" / "core" / "controller.py")


def test_a_build_for_another_interpreter_is_not_used(current_build, tmp_path):
    build_dir = tmp_path / "native"
    shutil.copytree(current_build, build_dir)
    stamp = json.loads((build_dir / "stamp.json").read_text(encoding="utf-8"))
    stamp["python"] = "3.11.0 (another build)"
    (build_dir / "stamp.json").write_text(json.dumps(stamp), encoding="utf-8")
    assert native.stale_modules(build_dir) == list(native.COMPILED_MODULES)
    assert _activation(build_dir, PROJECT_ROOT)[0] is False


def test_a_missing_or_damaged_stamp_means_python(tmp_path):
    assert native.stale_modules(tmp_path / "absent") == list(native.COMPILED_MODULES)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "stamp.json").write_text("{not json", encoding="utf-8")
    assert native.stale_modules(damaged) == list(native.COMPILED_MODULES)


def test_activating_after_the_core_was_imported_is_refused(current_build):
    import admission.core  # noqa: F401  (this process already has the Python modules)

    before = list(sys.meta_path)
    assert native.activate(current_build) is False
    assert sys.meta_path == before


def test_a_source_mypyc_cannot_compile_fails_the_build_and_keeps_the_previous_one(tmp_path):
    root = tmp_path / "sources"
    for tree in native._SOURCE_TREES:
        source = PROJECT_ROOT / tree
        if source.is_dir():
            shutil.copytree(source, root / tree, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (root / tree).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / tree)
    rules = root / "admission" / "core" / "rules.py"
    rules.write_text(
        rules.read_text(encoding="utf-8") + "\nBROKEN: int = 'not an int'\n", encoding="utf-8"
    )
    build_dir = tmp_path / "native"
    build_dir.mkdir()
    (build_dir / "stamp.json").write_text("{}", encoding="utf-8")
    with pytest.raises(RuntimeError, match="mypyc failed"):
        native.build(build_dir, root)
    assert (build_dir / "stamp.json").read_text(encoding="utf-8") == "{}"
