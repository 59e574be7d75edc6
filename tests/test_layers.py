"""The package's layers (docs/architecture.md): every import inside src/poskit, at module level or inside a
function, points to a lower layer or stays inside its own package, and no two modules import each other through
a circle. A module that needs something above it is in the wrong layer, or the thing it needs is."""
import ast
import pathlib

import poskit

SRC = pathlib.Path(poskit.__file__).parent

# docs/architecture.md's table; "poskit" is the package's face (its __init__ and nn.py)
LAYERS = {"util": 0, "encodings": 1, "data": 1, "tasks": 2, "attention": 2, "models": 3, "poskit": 4,
          "training": 5, "evaluate": 5, "report": 6, "hf": 6, "analyze": 7, "experiments": 8, "cli": 9}
FACE = {"__init__", "nn"}  # the package's face: poskit/__init__.py and poskit/nn.py


def _package(module: str) -> str:
    """poskit.<package>.x -> <package>; poskit itself -> "poskit"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] not in FACE else "poskit"


def _imports(path: pathlib.Path):
    """(line, imported module) of every import of poskit in `path`, relative ones resolved."""
    parts = ["poskit", *path.relative_to(SRC).with_suffix("").parts]
    package = parts[:-1]  # the package a relative import starts from (a package's own for __init__.py)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level else node.module or "")
            # `from poskit import training` imports the subpackage, not the face
            names = [f"{base}.{a.name}" if base == "poskit" and ((SRC / a.name).is_dir() or (SRC / f"{a.name}.py").exists())
                     else base for a in node.names]
        else:
            continue
        yield from ((node.lineno, n) for n in names if n == "poskit" or n.startswith("poskit."))


def test_the_layer_table_names_every_package():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in SRC.glob("*.py") if p.stem not in FACE}
    assert packages | modules <= set(LAYERS), sorted((packages | modules) - set(LAYERS))


def test_every_import_points_down_or_stays_in_its_package():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        own = "poskit" if len(rel.parts) == 1 and rel.stem in FACE else rel.parts[0].removesuffix(".py")
        for line, imported in _imports(path):
            other = _package(imported)
            if other != own and LAYERS[other] >= LAYERS[own]:
                wrong.append(f"{rel}:{line} ({own}, layer {LAYERS[own]}) imports {imported} (layer {LAYERS[other]})")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # the check above could pass by reading nothing: here it must find a planted upward import
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "bad.py").write_text("def f():\n    from poskit.cli import main\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert list(_imports(tmp_path / "util" / "bad.py")) == [(2, "poskit.cli")]


def _module_of(path: pathlib.Path) -> str:
    parts = ["poskit", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle_between_modules():
    # imports inside functions count too: a circle hidden in a function is still two modules that need each other
    modules = {_module_of(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for _, imported in _imports(path):
            while imported not in modules and "." in imported:  # `from poskit.x import name`: the module x
                imported = imported.rsplit(".", 1)[0]
            if imported != name and not name.startswith(imported + "."):  # a package's own __init__ is not a circle
                targets.add(imported)
        graph[name] = targets
    circles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ re-exporting its modules, which import siblings through it, is not counted: only
    # circles that do not pass through a package's __init__
    real = [c for c in circles if not any(modules[m].name == "__init__.py" for m in c[:-1])]
    assert not real, "\n".join(" -> ".join(c) for c in real)
