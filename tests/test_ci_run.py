"""The fresh-machine guarantee, checked without a network: README.md's set-up commands are what `.ci/run`
runs, in a new virtual environment; constraints.txt pins every package any extra installs; every skip that
needs an extra names the command that installs it."""
import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = (ROOT / "constraints.txt").read_text()


def _commands(text: str) -> list[str]:
    """Shell command lines of a script: no blank lines, no comments."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _readme_setup_commands() -> list[str]:
    # the README's set-up commands are the lines (in code blocks) that install poskit with the lock
    return sorted({line.strip() for line in README.splitlines()
                   if line.strip().startswith("pip install -c constraints.txt") and "&&" in line})


def test_readme_has_the_demo_and_the_test_command():
    commands = _readme_setup_commands()
    assert len(commands) == 2, commands
    assert any(c.endswith("&& poskit demo") for c in commands), commands
    assert any(re.search(r"&& python -m pytest( -q)?$", c) for c in commands), commands


def test_ci_runs_the_readme_test_command_last_and_verbatim():
    test_command = next(c for c in _readme_setup_commands() if "pytest" in c)
    # the command CI's verdict comes from: the last command of the script, character for character
    assert _commands(CI)[-1] == test_command


def test_ci_runs_in_a_new_virtual_environment():
    commands = _commands(CI)
    created = next(i for i, c in enumerate(commands) if re.search(r"python3? -m venv ", c))
    activated = next(i for i, c in enumerate(commands) if re.match(r"(source|\.) .*/bin/activate", c))
    first_pip = next(i for i, c in enumerate(commands) if "pip install" in c)
    assert created < activated < first_pip
    # no install step is allowed to fail quietly: a failed pip install fails CI
    assert "set -euo pipefail" in commands
    assert not any("pip install" in c and "||" in c for c in commands)


def _installs(text: str) -> list[str]:
    return [c for c in _commands(text) if "pip install" in c]


@pytest.mark.parametrize("source", ["README.md", ".ci/run"])
def test_every_install_uses_the_lock_and_names_real_extras(source):
    text = README if source == "README.md" else CI
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for command in _installs(text):
        for install in re.findall(r"pip install[^&|;]*", command):
            assert "-c constraints.txt" in install, install
            for group in re.findall(r'"\.\[([^\]]*)\]"', install):
                assert set(group.split(",")) <= extras, install


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9][a-z0-9-]*)==([0-9][0-9A-Za-z.!+-]*)", line)
        assert m, f"constraints.txt line {line!r} is not name==version (canonical name)"
        assert m.group(1) not in pins, f"{m.group(1)} pinned twice"
        pins[m.group(1)] = m.group(2)
    return pins


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group()).lower()


def test_the_lock_pins_every_requirement_of_the_project_and_its_extras():
    project = PYPROJECT["project"]
    requirements = list(project["dependencies"])
    for reqs in project["optional-dependencies"].values():
        requirements += reqs
    pins = _lock()
    missing = sorted({_name(r) for r in requirements} - set(pins))
    assert not missing, f"not in constraints.txt: {missing} (regenerate it: python scripts/lock.py)"
    assert pins["torch"] == "2.13.0" and pins["triton"] == "3.7.1"
    # pyproject's exact pins agree with the lock
    for r in requirements:
        exact = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", r)
        if exact:
            assert pins[_name(exact.group(1))] == exact.group(2), r


def test_the_lock_holds_the_test_tools_and_names_its_generator():
    pins = _lock()
    assert {"pytest", "hypothesis", "scipy"} <= set(pins)
    assert "python scripts/lock.py" in LOCK


def _skip_reasons(tree: ast.AST):
    """The string parts of every skip reason in a test module: pytest.skip(...), pytest.importorskip(...,
    reason=...), pytest.mark.skipif(..., reason=...)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if func in ("pytest.skip", "pytest.importorskip", "pytest.mark.skipif"):
            for arg in [*node.args, *(k.value for k in node.keywords if k.arg in ("reason", "msg"))]:
                for part in ast.walk(arg):
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        yield func, part.value


def test_every_skip_that_names_an_install_gives_the_exact_command():
    bad = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for func, text in _skip_reasons(ast.parse(path.read_text())):
            if re.search(r"pip install|poskit\[", text) and "pip install -c constraints.txt -e " not in text:
                bad.append(f"{path.name}: {func}: {text!r}")
    assert not bad, "\n".join(bad)


def test_the_skip_helper_gives_the_command_with_the_lock():
    from extras import install_command

    assert install_command("peers") == 'pip install -c constraints.txt -e ".[peers]"'
    with pytest.raises(pytest.skip.Exception, match=r'pip install -c constraints\.txt -e "\.\[peers\]"'):
        from extras import need

        need("a_module_that_does_not_exist_anywhere", "peers")
