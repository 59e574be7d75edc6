"""Every Python example of README.md and docs/usage.md runs (read from the files themselves, so the documents
and this test cannot drift apart)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/usage.md")
EXAMPLES = [(name, i, block) for name in DOCUMENTS
            for i, block in enumerate(re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(), flags=re.S))]


@pytest.mark.parametrize("name,minimum", [("README.md", 3), ("docs/usage.md", 8)])
def test_the_documents_have_their_examples(name, minimum):
    assert sum(n == name for n, _, _ in EXAMPLES) >= minimum, f"{name} lost examples"


@pytest.mark.parametrize("name,index,block", EXAMPLES, ids=[f"{n}-{i + 1}" for n, i, _ in EXAMPLES])
def test_example_runs(name, index, block):
    import torch

    torch.manual_seed(0)
    exec(compile(block, f"{name} (example {index + 1})", "exec"), {})
