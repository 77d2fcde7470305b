"""No import cycle between the top-level modules of any crate (the app
shell included), outside test code: each crate's modules form layers a
newcomer can read bottom to top (docs/architecture.md). A module is a
file or folder directly under `src/`; it depends on another when it names
`crate::<other>`."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CRATES = sorted(ROOT.glob("crates/*/src")) + [ROOT / "src-tauri" / "src"]


def module_of(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts[0] if parts else ""


def non_test_code(text: str) -> str:
    return text.split("#[cfg(test)]\nmod tests")[0]


def graph(src: Path) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in src.rglob("*.rs"):
        if "test" in path.name:
            continue
        module = module_of(src, path)
        if not module:
            continue
        text = non_test_code(path.read_text())
        # Comments name modules without importing them.
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
        deps = set(re.findall(r"crate::([a-z_0-9]+)", text))
        for group in re.findall(r"use crate::\{([^}]*)\}", text):
            deps |= {item.strip().split("::")[0] for item in group.split(",") if item.strip()}
        edges.setdefault(module, set()).update(d for d in deps if d and d != module)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle, as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_checker_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_crate_has_an_import_cycle_between_its_modules():
    found = {}
    for src in CRATES:
        loop = cycle(graph(src))
        if loop:
            found[str(src.relative_to(ROOT))] = " -> ".join(loop)
    assert not found, found
