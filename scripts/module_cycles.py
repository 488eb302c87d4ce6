#!/usr/bin/env python3
"""File-level import cycles among a crate's modules.

Usage: python3 scripts/module_cycles.py crates/netdiag/src [--children]

Each .rs file is a module (mod.rs/lib.rs stand for their directory). An edge A -> B is a path
in A's code (comments, strings and #[cfg(test)] code left out) that starts with crate::,
super:: or self:: and names module B (the longest module prefix of the path; `use x::{a, b}`
groups are followed). With --children, a parent's bare `child::` paths count too, so a
mod.rs that re-exports from a child the child imports from shows as a cycle. Prints each
strongly connected component of more than one file, with its edges, then the count.
"""
import os
import re
import sys


def modules(root):
    mods = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(dp, f)
                parts = os.path.relpath(p, root)[:-3].split('/')
                if parts[-1] in ('mod', 'lib', 'main'):
                    parts = parts[:-1]
                mods['::'.join(parts)] = p
    return mods


def resolve(mods, cur, segs):
    if segs[0] == 'crate':
        base, segs = [], segs[1:]
    elif segs[0] == 'super':
        base = cur[:]
        while segs and segs[0] == 'super':
            base, segs = base[:-1], segs[1:]
    elif segs[0] == 'self':
        base, segs = cur[:], segs[1:]
    else:
        return None
    best = None
    for i in range(len(segs) + 1):
        m = '::'.join(base + segs[:i])
        if m in mods:
            best = m
    return best


def edges_of(mods, children):
    edges = {}
    for m, p in mods.items():
        src = open(p).read()
        i = src.find('#[cfg(test)]')
        if i >= 0:
            src = src[:i]
        src = re.sub(r'//[^\n]*', '', src)
        src = re.sub(r'"(?:[^"\\]|\\.)*"', '""', src)
        cur = m.split('::') if m else []
        for mt in re.finditer(
            r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)(?:::\{([^;]*?)\})?', src, re.S
        ):
            segs = mt.group(1).split('::')
            groups = [[]]
            if mt.group(2):
                groups = [g.strip().split('::')[:1] for g in mt.group(2).split(',') if g.strip()]
            for g in groups:
                t = resolve(mods, cur, segs + [x for x in g if x not in ('self', '*')])
                if t is not None and t != m:
                    edges.setdefault(m, set()).add(t)
        if children:
            depth = m.count('::') + 1 if m else 0
            for c in mods:
                if c != m and c.startswith(m + '::' if m else '') and c.count('::') == depth:
                    name = c.split('::')[-1]
                    if re.search(r'(?<![:\w])' + name + r'::', src):
                        edges.setdefault(m, set()).add(c)
    return edges


def sccs(nodes, edges):
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        st.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in idx:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in nodes:
        if v not in idx:
            visit(v)
    return out


def main():
    root = sys.argv[1]
    mods = modules(root)
    edges = edges_of(mods, '--children' in sys.argv)
    found = sccs(list(mods), edges)
    for comp in found:
        print('CYCLE:', sorted(comp))
        for a in sorted(comp):
            for b in sorted(edges.get(a, ())):
                if b in comp:
                    print('  ', a or 'lib', '->', b or 'lib')
    print('modules', len(mods), 'cycles', len(found))
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
