"""Every example of the README's "Use it in your own model" section runs (read from README.md, so the README
and this test cannot drift apart)."""
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
SECTION = README.split("## Use it in your own model", 1)[1].split("\n## ", 1)[0]
EXAMPLES = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)


def test_the_section_has_its_examples():
    assert len(EXAMPLES) >= 4, "the README's 'Use it in your own model' section lost examples"


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_example_runs(index):
    import torch

    torch.manual_seed(0)
    exec(compile(EXAMPLES[index], f"README.md (Use it in your own model, example {index + 1})", "exec"), {})
