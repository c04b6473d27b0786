"""The package's layers, read from its import statements: every import points down (or sideways within a layer),
no import cycle, only the Lightning glue imports Lightning, and the verifiers import nothing of the trainer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ggpo_lightning"

LAYERS = {"records": 0, "core": 1, "rollouts": 2, "tasks": 2, "models": 3, "evaluation": 4, "lab": 4,
          "training": 5, "cli": 6, "testing": 6}
"""records -> core -> rollouts -> models -> evaluation / lab -> training (the glue) -> cli."""

LIGHTNING_GLUE = ("training", "cli")

ROLLOUT_ROOMS = {"hf": set(), "vllm": set(), "fleet": {"vllm"}}
"""The engine families of ``rollouts/``, a folder each, and the other rooms each may import: the fleet reuses the vLLM
room's requests, replies and reload. Besides these a room imports only its own modules and :data:`ROLLOUT_SHARED`."""
ROLLOUT_SHARED = {"ggpo_lightning.rollouts.config", "ggpo_lightning.rollouts.protocol"}
"""What every engine room builds on: the settings and the engine protocol."""
ROLLOUT_FACTORY = "ggpo_lightning.rollouts.factory"
"""The one module of ``rollouts/`` outside the rooms that imports them (the engine is chosen there)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function (a lazy import is still a dependency)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: {i for i in imports(path) if i in MODULES and i != name} for name, path in MODULES.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_every_module_is_in_a_layer_and_the_tree_is_not_flat():
    unplaced = [m for m in MODULES if m != "ggpo_lightning" and layer(m) is None]
    assert not unplaced, f"modules outside the layers {sorted(LAYERS)}: {unplaced}"
    top_level = [m for m in MODULES if m.count(".") == 1 and not (PACKAGE / m.split(".")[1]).is_dir()]
    assert top_level == ["ggpo_lightning.testing"], top_level


def test_imports_point_down_the_layers():
    upward = [f"{m} (layer {layer(m)}) imports {i} (layer {layer(i)})"
              for m, targets in GRAPH.items() for i in targets
              if layer(m) is not None and layer(i) is not None and layer(i) > layer(m)]
    assert not upward, "\n".join(upward)


def rollout_room(module: str) -> str | None:
    """The engine room of ``rollouts/`` that ``module`` is in (None: outside them)."""
    parts = module.split(".")
    in_folder = len(parts) > 2 and parts[1] == "rollouts" and (PACKAGE / "rollouts" / parts[2]).is_dir()
    return parts[2] if in_folder else None


def test_every_folder_of_rollouts_is_a_room():
    folders = {p.name for p in (PACKAGE / "rollouts").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ROLLOUT_ROOMS)


def test_each_rollout_room_imports_only_itself_what_it_shares_and_the_rooms_it_builds_on():
    crossing = [f"{m} imports {i}" for m, targets in GRAPH.items() if rollout_room(m)
                for i in targets if i.startswith("ggpo_lightning.rollouts.") and i not in ROLLOUT_SHARED
                and rollout_room(i) not in {rollout_room(m), *ROLLOUT_ROOMS[rollout_room(m)]}]
    assert not crossing, "\n".join(crossing)


def test_only_the_factory_opens_the_rollout_rooms():
    """The protocol, the sources, the producer and the group rollout never name an engine family."""
    opened = [f"{m} imports {i}" for m, targets in GRAPH.items()
              if m.startswith("ggpo_lightning.rollouts") and rollout_room(m) is None and m != ROLLOUT_FACTORY
              for i in targets if rollout_room(i)]
    assert not opened, "\n".join(opened)


def one_letter_apart(a: str, b: str) -> bool:
    """``a`` and ``b`` differ by one letter added, dropped or changed (``engine`` / ``engines``)."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    short, long = sorted((a, b), key=len)
    i = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i + (len(short) == len(long)):] == long[i + 1:]


def test_no_two_modules_of_the_package_are_one_letter_apart():
    names = sorted({p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*") if p.is_dir()})
    close = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if one_letter_apart(a, b)]
    assert not close, close
    assert one_letter_apart("engine", "engines") and one_letter_apart("vllm_server", "vllm_servers")
    assert one_letter_apart("batch", "match") and not one_letter_apart("engine", "engine")


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle of ``graph`` met in a depth-first walk, as ``a -> b -> a``."""
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_there_is_no_import_cycle():
    assert find_cycles(GRAPH) == []


def test_the_cycle_check_finds_a_cycle():
    """The check itself can fail."""
    assert find_cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x -> a.y -> a.z -> a.x"]


def test_only_the_glue_imports_lightning():
    importers = [m for m, path in MODULES.items()
                 if any(i == "lightning" or i.startswith(("lightning.", "pytorch_lightning")) for i in imports(path))]
    assert importers and all(m.split(".")[1] in LIGHTNING_GLUE for m in importers), importers


def test_the_verifiers_import_nothing_of_the_trainer():
    verifiers = list((ROOT / "verifiers").glob("*.py"))
    assert verifiers
    offenders = [p.name for p in verifiers if any(i.split(".")[0] == "ggpo_lightning" for i in imports(p))]
    assert not offenders, offenders
