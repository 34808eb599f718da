"""The source layout of DESIGN.md ("Layers"): imports between the folders of src/safetile
point one way (importing the package facade counts as importing what it imports), no
module hides an import behind a late-bound ``[None]`` slot or a method patched onto a class
after it, and every file stays at 450 lines or fewer."""
import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "safetile"
MAX_LINES = 450
# Lower layers first: a folder imports only folders before it (DESIGN.md, "Layers").
LAYERS = ["errors", "dtypes", "lang", "tensor", "device", "backends", "kernel", "ops"]


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(name: str) -> bool:
    base = SRC.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imported(path: pathlib.Path):
    """Every module ``path`` imports (module level, inside functions, under TYPE_CHECKING)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:                  # `from pkg import submodule`
                sub = f"{target}.{a.name}"
                yield sub if exists(sub) else target


def folder(name: str):
    """The layer a safetile module belongs to (its folder, or a top-level module's name)."""
    parts = name.split(".")
    if parts[0] != "safetile" or len(parts) < 2:
        return None
    return parts[1]


def facade_layers() -> set:
    """The layers the ``safetile`` package itself (its facade) imports."""
    return {folder(t) for t in imported(PACKAGE / "__init__.py")} - {None}


def folder_graph() -> dict:
    """layer -> {layer it imports: [files]}; importing the ``safetile`` package counts as
    importing every layer its facade imports."""
    graph: dict = {}
    facade = facade_layers()
    for path in modules():
        src = folder(module_name(path))
        if src is None:                           # the facade itself
            continue
        for target in imported(path):
            for dst in facade if target == "safetile" else {folder(target)}:
                if dst is not None and dst != src:
                    graph.setdefault(src, {}).setdefault(dst, []).append(
                        str(path.relative_to(SRC)))
    return graph


def cycle(graph: dict):
    """One cycle of folders in ``graph`` (a list), or None."""
    state: dict = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, {}):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in list(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle_through_three_folders():
    assert cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b": []}, "b": {"c": []}}) is None


def test_no_import_cycle_between_folders():
    graph = folder_graph()
    found = cycle(graph)
    assert found is None, " -> ".join(found) + ": " + "; ".join(
        f"{a} -> {b} in {sorted(set(graph[a][b]))}" for a, b in zip(found, found[1:]))


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer):
    below = set(LAYERS[:LAYERS.index(layer)])
    upward = {dst: files for dst, files in folder_graph().get(layer, {}).items()
              if dst in LAYERS and dst not in below}
    assert not upward, f"{layer} imports {upward}"


def patched_methods(tree: ast.Module) -> list:
    """Module-level ``Class.name = function`` assignments of a function the module defines
    (a method bound after its class, as a late import would be)."""
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef))}
    return [n.lineno for n in tree.body if isinstance(n, ast.Assign) and
            isinstance(n.value, ast.Name) and n.value.id in functions and
            any(isinstance(t, ast.Attribute) for t in n.targets)]


def test_the_patch_finder_finds_a_method_bound_after_its_class():
    tree = ast.parse("class A:\n    pass\ndef f(self):\n    pass\nA.f = f\nA.g = None\n")
    assert patched_methods(tree) == [5]


def test_no_method_is_patched_onto_a_class():
    found = {str(p.relative_to(SRC)): patched_methods(ast.parse(p.read_text()))
             for p in modules()}
    assert {p: lines for p, lines in found.items() if lines} == {}


def late_bound_slots(tree: ast.Module) -> list:
    """Module-level ``NAME = [None]`` assignments (a slot filled in later to dodge a cycle)."""
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.List) and len(value.elts) == 1 and \
                isinstance(value.elts[0], ast.Constant) and value.elts[0].value is None:
            found.append(node.lineno)
    return found


def test_the_slot_finder_finds_a_none_slot():
    assert late_bound_slots(ast.parse("_x = [None]\ny: list = [None]\nz = [None] * 3")) == [1, 2]


def test_no_late_bound_module_slots():
    found = {str(p.relative_to(SRC)): late_bound_slots(ast.parse(p.read_text()))
             for p in modules()}
    assert {p: lines for p, lines in found.items() if lines} == {}


def test_every_source_file_has_at_most_450_lines():
    long = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


GROUT = SRC / "grout"


def grout_trees():
    return [(p.name, ast.parse(p.read_text())) for p in sorted(GROUT.glob("*.py"))]


def st_attributes(tree):
    """Every ``st.NAME`` a module reads (grout imports safetile as ``st``)."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "st"]


def test_grout_imports_only_safetiles_public_api_and_its_ops():
    import safetile
    public = set(safetile.__all__) | {"ops"}
    allowed = {"safetile", "safetile.ops"}
    found = []
    for name, tree in grout_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(name, a.name) for a in node.names
                          if a.name.startswith("safetile") and a.name not in allowed]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("safetile"):
                found += [(name, f"{node.module}.{a.name}") for a in node.names
                          if node.module not in allowed
                          or (node.module == "safetile" and a.name not in public)]
        found += [(name, f"st.{node.attr}") for node in st_attributes(tree)
                  if node.attr not in public and not node.attr.startswith("__")]
    assert found == []


def test_grout_defines_no_kernels_of_its_own():
    grammar = {"kernel", "function", "In", "Out", "Const", "Ptr", "unsafe"}
    found = [(name, node.lineno) for name, tree in grout_trees()
             for node in st_attributes(tree) if node.attr in grammar]
    assert found == []
