"""The model package's import graph is acyclic, and no module imports another's private names."""

import ast
import graphlib
import pathlib

import empo2_jax.model

PACKAGE = "empo2_jax.model"
ROOT = pathlib.Path(empo2_jax.model.__file__).parent


def _imports(path: pathlib.Path) -> list[tuple[str, str]]:
  """(module, name) for every `from empo2_jax.model... import name` in the file, at any depth
  (lazy imports inside functions count), and (module, "") for `import empo2_jax.model...`."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
      for alias in node.names:
        sub = f"{PACKAGE}.{alias.name}" if node.module == PACKAGE else node.module
        out.append((sub, "" if node.module == PACKAGE else alias.name))
    elif isinstance(node, ast.Import):
      out += [(a.name, "") for a in node.names if a.name.startswith(PACKAGE + ".")]
  return out


def test_model_package_import_graph_is_acyclic_and_public():
  graph, private = {}, []
  for path in sorted(ROOT.glob("*.py")):
    module = f"{PACKAGE}.{path.stem}"
    deps = _imports(path)
    graph[module] = {m for m, _ in deps} - {module}
    private += [f"{module}: {m}.{n}" for m, n in deps if n.startswith("_")]
  assert not private
  list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
