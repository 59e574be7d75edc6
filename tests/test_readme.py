"""The README's promises: its usage example runs, and CI calls exactly its test command."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_usage_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {})


def test_exactly_two_setup_commands_and_ci_runs_the_test_one():
    section = README.split("## Set-up commands", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]
    assert len(commands) == 2, commands
    assert commands[0].endswith("poskit demo")
    test_command = commands[1]
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in [line.strip() for line in ci]
