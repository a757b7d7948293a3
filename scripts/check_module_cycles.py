#!/usr/bin/env python3
"""Fails when the modules of a product crate import each other in a circle.

For every `crate::`, `super::` and `self::` path in a crate's `src/`, the
edge is drawn between the two sibling modules under the paths' closest
common ancestor (`crate::v1::events` naming `crate::v1::views` is the edge
events -> views inside `v1`); a module naming its own ancestor or descendant
draws none. Every strongly connected set of two or more siblings is
reported with one path that closes each of its loops. Test modules
(`tests.rs`, `*_tests.rs`, and whatever follows `#[cfg(test)]` in a file)
do not count: tests may reach anywhere.

The tools that ship with no node (the benchmark, the test kit, the
Kafka mock) are not product crates and are not checked.

Usage: scripts/check_module_cycles.py [CRATES_DIR]   (default: crates)
"""

import os
import re
import sys
from collections import defaultdict

TOOLS = {"belfry-bench", "belfry-testkit", "belfry-kafka-mock"}
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
TEST_CUT = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+\w+\s*\{")


def modules_of(src):
    """Maps each module path (tuple) to its file, from the file layout."""
    mods = {}
    for root, _dirs, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            full = os.path.join(root, name)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel[0] == "bin":
                continue
            if rel[-1] in ("lib", "main") and len(rel) == 1:
                path = ()
            elif rel[-1] == "mod":
                path = tuple(rel[:-1])
            else:
                path = tuple(rel)
            mods[path] = full
    return mods


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner = tree[:start], tree[start + 1 : i]
                parts, level, last = [], 0, 0
                for j, c in enumerate(inner):
                    if c == "{":
                        level += 1
                    elif c == "}":
                        level -= 1
                    elif c == "," and level == 0:
                        parts.append(inner[last:j])
                        last = j + 1
                parts.append(inner[last:])
                out = []
                for part in parts:
                    if part:
                        out.extend(expand_use(prefix + part))
                return out
    return [tree]


def resolve(module, path, mods):
    """The deepest known module a `crate::`/`super::`/`self::` path names."""
    segments = path.split("::")
    base = list(module)
    head = segments.pop(0)
    if head == "crate":
        base = []
    elif head == "super":
        base = base[:-1]
        while segments and segments[0] == "super":
            segments.pop(0)
            base = base[:-1]
    best = tuple(base)
    current = list(base)
    for seg in segments:
        if not WORD.fullmatch(seg):
            break
        current.append(seg)
        if tuple(current) in mods:
            best = tuple(current)
        else:
            break
    return best


def edges_of(mods):
    edges = defaultdict(set)  # parent -> set of (from_child, to_child, file)
    for module, file in mods.items():
        if module and (module[-1] == "tests" or module[-1].endswith("_tests")):
            continue
        with open(file, encoding="utf-8") as f:
            text = f.read()
        cut = TEST_CUT.search(text)
        if cut:
            text = text[: cut.start()]
        # Comments (doc links included) name modules without depending on them.
        text = COMMENT.sub("", text)
        paths = []
        for m in USE.finditer(text):
            paths.extend(expand_use(m.group(1)))
        for m in PATH.finditer(USE.sub("", text)):
            paths.append(m.group(1) + m.group(2))
        for path in paths:
            target = resolve(module, path, mods)
            common = 0
            while (
                common < len(module)
                and common < len(target)
                and module[common] == target[common]
            ):
                common += 1
            if common == len(module) or common == len(target):
                continue  # ancestor or descendant
            parent = module[:common]
            edges[parent].add((module[common], target[common], file))
    return edges


def cycles(graph):
    """Tarjan's strongly connected components with two or more nodes."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    crates_dir = sys.argv[1] if len(sys.argv) > 1 else "crates"
    failures = 0
    for crate in sorted(os.listdir(crates_dir)):
        if crate in TOOLS:
            continue
        src = os.path.join(crates_dir, crate, "src")
        if not os.path.isdir(src):
            continue
        mods = modules_of(src)
        for parent, found in sorted(edges_of(mods).items()):
            graph = defaultdict(set)
            where = {}
            for a, b, file in found:
                graph[a].add(b)
                where.setdefault((a, b), file)
            for component in cycles(graph):
                failures += 1
                inside = "::".join(("crate",) + parent)
                print(f"{crate}: modules under {inside} import each other in a circle:")
                members = set(component)
                for a in component:
                    for b in sorted(graph[a] & members):
                        print(f"  {a} -> {b}  ({where[(a, b)]})")
    if failures:
        print(f"{failures} import circle(s); draw the arrows one way (move the shared piece down)")
        return 1
    print("no import circles among the modules of any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
