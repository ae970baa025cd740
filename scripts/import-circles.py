#!/usr/bin/env python3
"""Import circles between the modules of each crate, outside `#[cfg(test)] mod tests`.

An edge runs from a module to each module it names (`crate::a::b`, `use crate::{a, b::c}`, `super::`), and from
`lib.rs` to each top-level module it names (`a::x`, `pub use a::...`), so a module importing an item of `lib.rs`
that uses it closes a circle; `--modules-only` leaves `lib.rs` out (circles among its modules only).
Usage: scripts/import-circles.py [--modules-only] crates/* tests; exits 1 when it finds one.
"""
import os, re, sys

def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'): continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] in ('lib', 'main') and len(rel) == 1: name = ['crate'] if rel[-1] == 'lib' else None
            elif rel[-1] == 'mod': name = ['crate'] + rel[:-1]
            else: name = ['crate'] + rel
            if name is None: continue
            if 'bin' in rel[:-1]: continue
            mods['::'.join(name)] = p
    return mods

def strip_tests(text):
    m = re.search(r'\n#\[cfg\(test\)\]\s*\n\s*mod tests', text)
    return text[:m.start()] if m else text

def paths_in(text):
    out = []
    # expand use crate::{a, b::c, d::{e, f}} one level deep
    for m in re.finditer(r'\bcrate::\{([^}]*(?:\{[^}]*\}[^}]*)*)\}', text):
        for part in re.split(r',(?![^{]*\})', m.group(1)):
            part = part.strip()
            if part: out.append('crate::' + re.sub(r'::\{.*', '', part, flags=re.S))
    for m in re.finditer(r'\bcrate((?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
        out.append('crate' + m.group(1))
    return out

def resolve(path, mods):
    parts = path.split('::')
    for n in range(len(parts), 0, -1):
        cand = '::'.join(parts[:n])
        if cand in mods: return cand
    return 'crate'

def sccs(graph):
    index, low, stack, on, res, i = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: res.append(sorted(comp))
    for v in list(graph): 
        if v not in index: visit(v)
    return res

modules_only = '--modules-only' in sys.argv
crates = [a for a in sys.argv[1:] if a != '--modules-only']
total = 0
for crate in sorted(crates):
    src = os.path.join(crate, 'src')
    mods = modules(src)
    graph = {}
    for name, p in mods.items():
        text = strip_tests(open(p).read())
        text = re.sub(r'//.*', '', text)
        deps = set()
        for path in paths_in(text):
            t = resolve(path, mods)
            if t != name and not (modules_only and t == 'crate'): deps.add(t)
        if name == 'crate' and not modules_only:
            for m in mods:
                if m.count('::') == 1 and re.search(r'(?<![:\w])' + m.split('::')[1] + r'::', text):
                    deps.add(m)
        parent = name.rsplit('::', 1)[0] if '::' in name else None
        if parent and re.search(r'\bsuper::', text): deps.add(parent)
        graph[name] = deps
    cyc = sccs(graph)
    total += len(cyc)
    for c in cyc: print(f'{crate}: cycle among {", ".join(c)}')
print(f'{total} import circle(s) in {len(crates)} crate(s)')
sys.exit(1 if total else 0)
