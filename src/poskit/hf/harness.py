"""`python -m poskit.hf.harness ARGS`: lm-evaluation-harness's command line, with poskit's model type known.

lm-eval loads `--model hf --model_args pretrained=DIR` through transformers' Auto classes, which learn the
"poskit" model type only when `poskit.hf` is imported; this entry point imports it and then runs lm-eval's
own CLI with the arguments unchanged (`lm-eval run ...` / `lm-eval ls tasks` become
`python -m poskit.hf.harness run ...` / `python -m poskit.hf.harness ls tasks`).
"""
from __future__ import annotations

import sys

import poskit.hf  # noqa: F401  (registers PoskitConfig / PoskitForCausalLM with the Auto classes)


def main() -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        sys.exit("python -m poskit.hf.harness needs lm-evaluation-harness: pip install -c constraints.txt "
                 "-e \".[hf,peers]\" (or pip install lm-eval)")
    sys.argv[0] = "python -m poskit.hf.harness"
    cli_evaluate()


if __name__ == "__main__":
    main()
