"""The package's layering, read from the source with `ast` (nothing is imported, so this runs in a
second): no import cycles, the lower layers never import the upper ones, and no module reaches
into another's underscore names.

The graph: one node per module of empo2_jax/, launch/ and configs/ (a package is its __init__);
an edge for every `import` and `from ... import` anywhere in a file (module level, inside
functions, under `if TYPE_CHECKING:`). `from empo2_jax.a import b` points at the module
empo2_jax.a.b when there is one, else at empo2_jax.a (its __init__, which re-exports b). Importing
empo2_jax.a.b also runs empo2_jax/a/__init__.py, but that implicit edge is not drawn: a package's
__init__ importing its own submodules is then no cycle with them, while a submodule that imports
names back from its package's __init__ (which imports the submodule) is one. Modules named in
strings and imported with importlib (envs/registry.BUILTIN, train/build.EMBEDDED_MODELS) are
plugins looked up at run time and draw no edge.
"""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = ("empo2_jax", "launch", "configs")
# Layers: a module under LOWER must not import one under UPPER.
LOWER = tuple(f"empo2_jax.{p}" for p in ("rl", "sampling", "model", "memory", "envs"))
UPPER = tuple(f"empo2_jax.{p}" for p in ("methods", "baselines", "train"))
# Every package and top-level module of empo2_jax (and launch/, configs/), floor by floor from the
# bottom: a unit imports only units on LOWER floors (and itself). A new package must be placed
# here; an import that runs sideways or back up fails with its file and line.
FLOORS = (
  ("errors", "text", "config_keys", "platforms"),  # leaves
  ("remote", "tips"),
  ("parallel", "compile_cache"),  # primitives: mesh, sharding rules
  ("model", "data"),
  ("rl", "sampling"),
  ("memory", "envs"),
  ("agent", "programs"),
  ("methods",),  # one module per method, over the trainer's parts
  ("defaults",),
  ("preflight", "train"),
  ("baselines",),
  ("cli",),
  ("configs", "launch"),
)
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _sources() -> dict[str, tuple[pathlib.Path, ast.Module]]:
  out = {}
  for top in TOPS:
    for path in sorted((ROOT / top).rglob("*.py")):
      out[_module_name(path)] = (path, ast.parse(path.read_text(), str(path)))
  return out


SOURCES = _sources()
MODULES = set(SOURCES)


def _within(name: str, prefixes) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def _known(dotted: str) -> str | None:
  """The longest prefix of `dotted` that is one of our modules."""
  parts = dotted.split(".")
  for n in range(len(parts), 0, -1):
    name = ".".join(parts[:n])
    if name in MODULES:
      return name
  return None


def _is_private(name: str) -> bool:
  return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Imports(ast.NodeVisitor):
  """Edges, private-name uses, and the local names bound to our modules, for one file."""

  def __init__(self, module: str, path: pathlib.Path):
    self.module, self.path = module, path
    self.is_package = path.name == "__init__.py"
    self.edges: list[tuple[str, int]] = []  # (imported module, line)
    self.private: list[str] = []
    self.aliases: dict[str, str] = {}  # local name -> our module it is bound to

  def _where(self, node) -> str:
    return f"{self.path.relative_to(ROOT)}:{node.lineno}"

  def visit_Import(self, node: ast.Import):
    for alias in node.names:
      target = _known(alias.name)
      if target is None:
        continue
      self.edges.append((target, node.lineno))
      if alias.asname:
        self.aliases[alias.asname] = target
      else:  # `import empo2_jax.a.b` binds `empo2_jax`; attribute chains are resolved below
        self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]

  def visit_ImportFrom(self, node: ast.ImportFrom):
    base = node.module or ""
    if node.level:  # relative: resolved against this module's package
      package = self.module.split(".")
      if not self.is_package:
        package = package[:-1]
      package = package[: len(package) - (node.level - 1)]
      base = ".".join(package + ([base] if base else []))
    if _known(base) is None and base.split(".")[0] not in TOPS:
      return
    for alias in node.names:
      sub = f"{base}.{alias.name}"
      if sub in MODULES:
        self.edges.append((sub, node.lineno))
        self.aliases[alias.asname or alias.name] = sub
        if _is_private(alias.name):
          self.private.append(f"{self._where(node)}: from {base} import {alias.name}")
        continue
      target = _known(base)
      if target is None:
        continue
      self.edges.append((target, node.lineno))
      if _is_private(alias.name):
        self.private.append(f"{self._where(node)}: from {base} import {alias.name}")

  def visit_Attribute(self, node: ast.Attribute):
    # The dotted chain `x.y.z._name`: when `x.y.z` is (bound to) one of our modules other than
    # this one, `_name` is another module's private name.
    chain, value = [node.attr], node.value
    while isinstance(value, ast.Attribute):
      chain.append(value.attr)
      value = value.value
    if isinstance(value, ast.Name) and value.id in self.aliases:
      chain.reverse()  # outermost first: chain[-1] is node.attr
      owner = ".".join([self.aliases[value.id], *chain[:-1]])
      if owner in MODULES and owner != self.module and _is_private(node.attr):
        self.private.append(f"{self._where(node)}: {owner}.{node.attr}")
    self.generic_visit(node)


def _scan() -> dict[str, _Imports]:
  out = {}
  for module, (path, tree) in SOURCES.items():
    v = _Imports(module, path)
    v.visit(tree)
    out[module] = v
  return out


SCAN = _scan()
GRAPH = {m: sorted({t for t, _ in v.edges if t != m}) for m, v in SCAN.items()}


def _strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
  """Tarjan's algorithm, iterative; components of more than one module."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  counter = 0
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(graph[root]))]
    index[root] = low[root] = counter
    counter += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = counter
          counter += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(graph[child])))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          m = stack.pop()
          on_stack.discard(m)
          component.append(m)
          if m == node:
            break
        if len(component) > 1:
          out.append(sorted(component))
  return out


def _shortest_cycle(component: list[str]) -> list[str]:
  """A shortest cycle through the component's first module, by breadth-first search."""
  members, start = set(component), component[0]
  parent, queue = {start: None}, collections.deque([start])
  while queue:
    node = queue.popleft()
    for child in GRAPH[node]:
      if child == start:
        path = [node]
        while parent[path[-1]] is not None:
          path.append(parent[path[-1]])
        return [*reversed(path), start]
      if child in members and child not in parent:
        parent[child] = node
        queue.append(child)
  raise AssertionError(f"no cycle through {start}")


def _line(src: str, dst: str) -> str:
  lines = sorted({n for t, n in SCAN[src].edges if t == dst})
  return f"{SCAN[src].path.relative_to(ROOT)}:{','.join(map(str, lines))}"


def test_the_scan_sees_the_package():
  assert {"empo2_jax", "empo2_jax.rl.losses", "empo2_jax.train.trainer"} <= MODULES
  assert any(m.startswith("launch.") for m in MODULES)
  assert any(m.startswith("configs.") for m in MODULES)
  assert "empo2_jax.train.trainer" in GRAPH["launch.train"]
  # function-level imports count: configs/sweeps.py imports methods inside functions
  assert "empo2_jax.methods" in GRAPH["configs.sweeps"]


def test_the_scan_sees_function_level_imports_and_private_uses():
  code = (
    "import empo2_jax.rl.losses\n"
    "from empo2_jax.model import llama as L\n"
    "def f():\n"
    "  from empo2_jax.train.trainer import _helper, Trainer\n"
    "  return L._attend, empo2_jax.rl.losses._x, L.public\n"
  )
  v = _Imports("empo2_jax.memory.store", ROOT / "empo2_jax" / "memory" / "store.py")
  v.visit(ast.parse(code))
  assert {t for t, _ in v.edges} == {
    "empo2_jax.rl.losses",
    "empo2_jax.model.llama",
    "empo2_jax.train.trainer",
  }
  assert [p.split(": ", 1)[1] for p in v.private] == [
    "from empo2_jax.train.trainer import _helper",
    "empo2_jax.model.llama._attend",
    "empo2_jax.rl.losses._x",
  ]


def test_no_import_cycles():
  problems = []
  for component in _strongly_connected(GRAPH):
    cycle = _shortest_cycle(component)
    inside = [(a, b) for a in component for b in GRAPH[a] if b in component]
    edges = "\n".join(f"    {a} -> {b}  ({_line(a, b)})" for a, b in inside)
    problems.append(
      f"  {len(component)} modules, e.g. {' -> '.join(cycle)}; their imports of each other:\n"
      + edges
    )
  assert not problems, "import cycles:\n" + "\n".join(problems)


def test_lower_layers_do_not_import_methods_baselines_or_train():
  problems = [
    f"  {src} -> {dst}  ({_line(src, dst)})"
    for src in sorted(GRAPH)
    if _within(src, LOWER)
    for dst in GRAPH[src]
    if _within(dst, UPPER)
  ]
  assert not problems, f"{', '.join(LOWER)} import {', '.join(UPPER)}:\n" + "\n".join(problems)


def test_no_module_uses_another_modules_private_names():
  problems = [f"  {p}" for m in sorted(SCAN) for p in SCAN[m].private]
  assert not problems, "uses of another module's _private names:\n" + "\n".join(problems)


def _unit(module: str) -> str:
  """empo2_jax.<package or top-level module>, or the top folder (launch, configs)."""
  parts = module.split(".")
  return parts[1] if parts[0] == "empo2_jax" and len(parts) > 1 else parts[0]


def test_every_package_is_on_a_floor():
  units = {_unit(m) for m in MODULES} - {"empo2_jax"}  # the package's own __init__
  missing = sorted(units - set(FLOOR))
  assert not missing, f"place these in tests/core/test_layering.py FLOORS: {missing}"


def _sideways_or_up(graph) -> list[tuple[str, str]]:
  """(importer, imported) pairs of `graph` across units whose target's floor is not lower."""
  return [
    (src, dst)
    for src in sorted(graph)
    if _unit(src) in FLOOR
    for dst in graph[src]
    if _unit(dst) in FLOOR and _unit(dst) != _unit(src) and FLOOR[_unit(dst)] >= FLOOR[_unit(src)]
  ]


def test_no_import_runs_sideways_or_back_up():
  """Folder level, every package: an import goes to a lower floor or stays in its own unit."""
  problems = [
    f"  {a} -> {b}  ({_line(a, b)}): floor {FLOOR[_unit(a)]} -> {FLOOR[_unit(b)]}"
    for a, b in _sideways_or_up(GRAPH)
  ]
  assert not problems, "imports that run sideways or back up:\n" + "\n".join(problems)


def test_the_floor_check_fails_on_arrows_back_up_and_sideways():
  """Arrows that once ran back up (envs -> agent, memory -> envs, parallel -> rl) are caught, and
  so is a sideways import between units of one floor; downward and in-unit imports are not."""
  graph = {
    "empo2_jax.envs.scienceworld.suite": ["empo2_jax.agent.prompts", "empo2_jax.tips"],
    "empo2_jax.memory.reflect": ["empo2_jax.envs.actions", "empo2_jax.memory.store"],
    "empo2_jax.parallel.train_lm": ["empo2_jax.rl.update"],
    "empo2_jax.rl.batch": ["empo2_jax.sampling.session", "empo2_jax.model.llama"],
  }
  assert _sideways_or_up(graph) == [
    ("empo2_jax.envs.scienceworld.suite", "empo2_jax.agent.prompts"),
    ("empo2_jax.memory.reflect", "empo2_jax.envs.actions"),
    ("empo2_jax.parallel.train_lm", "empo2_jax.rl.update"),
    ("empo2_jax.rl.batch", "empo2_jax.sampling.session"),
  ]


def test_no_hand_off_through_self_last_attributes():
  """What one call makes is returned, not left in a `self.last_*` attribute for the caller to read
  afterwards (a hidden hand-off between methods)."""
  found = [
    f"{path.relative_to(ROOT)}:{node.lineno} self.{node.attr}"
    for path, tree in SOURCES.values()
    for node in ast.walk(tree)
    if isinstance(node, ast.Attribute)
    and isinstance(node.ctx, ast.Store)
    and isinstance(node.value, ast.Name)
    and node.value.id == "self"
    and node.attr.startswith("last_")
  ]
  assert not found, "state handed off through self.last_*:\n" + "\n".join(found)
