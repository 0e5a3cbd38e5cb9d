"""The README's examples run as written: every ```python block of README.md, in
order, in one namespace, on the 8 virtual CPU devices of tests/conftest.py. A new
user copies them; so a block that raises fails here."""
import pathlib
import re

import jax
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str]]:
  """(first line number, source) of each ```python block."""
  return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def test_blocks_are_found():
  text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x\n```\n"
  assert python_blocks(text) == [(3, "x = 1\n"), (9, "y = x\n")]


def test_readme_examples_run():
  if jax.device_count() < 8:
    pytest.skip(f"the README's meshes need 8 devices, have {jax.device_count()}")
  blocks = python_blocks(README.read_text())
  assert len(blocks) >= 3, "README.md should show shard_map, NNX and MoE examples"
  ns: dict = {"__name__": "readme"}
  for line, src in blocks:
    # Compiled with the README's name and line numbers, so a traceback points at the block.
    code = compile("\n" * (line - 1) + src, str(README), "exec")
    try:
      exec(code, ns)  # noqa: S102 (the README's own examples)
    except Exception as e:
      raise AssertionError(f"README.md block at line {line} raised {type(e).__name__}: {e}") from e
