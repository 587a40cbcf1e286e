"""Summation trees: FPRev-style probing inputs, tree inference, evaluation (numpy only).

A tree over n leaves (row positions 0..n-1) is a nested list: a leaf is an int, an internal node a list of
children (two for an ordinary addition). Children are listed by their smallest leaf (addition is commutative,
so the probe cannot tell a+b from b+a).

Probe (after FPRev, Xie et al. 2024): for a pair i < j the row holds +BIG at i, -BIG at j and 1.0 elsewhere, with
BIG so large that BIG + (any partial sum of ones) rounds to BIG. Every 1 that meets BIG or -BIG before the two
cancel is lost, and those are exactly the leaves below the lowest common ancestor (LCA) of i and j. So
`row sum = n - size(LCA(i, j))`; the LCA sizes of all pairs determine the tree.
"""

from __future__ import annotations

import numpy as np

BIG = 2.0**40


def all_pairs(n: int) -> np.ndarray:
    i, j = np.triu_indices(n, k=1)
    return np.stack([i, j], axis=1).astype(np.int64)


def fprev_rows(n: int, pairs: np.ndarray, big: float = BIG) -> np.ndarray:
    rows = np.ones((len(pairs), n), dtype=np.float32)
    ar = np.arange(len(pairs))
    rows[ar, pairs[:, 0]] = big
    rows[ar, pairs[:, 1]] = -big
    return rows


def lca_sizes_from_sums(sums: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """LCA sizes n - sum, and the number of sums that are not integers in [0, n-2] (probe failures)."""
    s = np.asarray(sums, dtype=np.float64)
    bad = ~np.isfinite(s) | (s != np.round(s)) | (s < 0) | (s > n - 2)
    return (n - np.where(bad, 0, s)).astype(np.int64), int(bad.sum())


def _min_leaf(node) -> int:
    return node if isinstance(node, int) else min(_min_leaf(c) for c in node)


def _sfind(sub: dict, x: int) -> int:
    sub.setdefault(x, x)
    while sub[x] != x:
        sub[x] = sub[sub[x]]
        x = sub[x]
    return x


def infer_tree(n: int, pairs: np.ndarray, sizes: np.ndarray) -> dict:
    """Agglomerative reconstruction from LCA sizes (smallest first). Returns {"tree", "consistent",
    "problems", "lca_mismatch"} where lca_mismatch counts pairs whose LCA size in the inferred tree differs
    from the measured one."""
    parent = list(range(n))
    node: dict[int, object] = {i: i for i in range(n)}
    size = dict.fromkeys(range(n), 1)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    problems: list[str] = []
    order = np.argsort(sizes, kind="stable")
    sizes_sorted = sizes[order]
    pos = 0
    while pos < len(order):
        s = int(sizes_sorted[pos])
        end = pos
        while end < len(order) and sizes_sorted[end] == s:
            end += 1
        # components among current roots joined by pairs of LCA size s
        sub: dict[int, int] = {}

        for t in order[pos:end]:
            i, j = int(pairs[t, 0]), int(pairs[t, 1])
            ri, rj = find(i), find(j)
            if ri == rj:
                if len(problems) < 20:
                    problems.append(f"pair {i},{j} has LCA size {s} but was joined below")
                continue
            a, b = _sfind(sub, ri), _sfind(sub, rj)
            if a != b:
                sub[a] = b
        comps: dict[int, list[int]] = {}
        for r in list(sub):
            comps.setdefault(_sfind(sub, r), []).append(r)
        for roots in comps.values():
            if len(roots) < 2:
                continue
            roots.sort(key=lambda r: _min_leaf(node[r]))
            total = sum(size[r] for r in roots)
            if total != s and len(problems) < 20:
                problems.append(f"node of measured size {s} has {total} leaves")
            new = roots[0]
            children = [node[r] for r in roots]
            for r in roots[1:]:
                parent[r] = new
            node[new] = children
            size[new] = total
        pos = end
    roots = sorted({find(i) for i in range(n)}, key=lambda r: _min_leaf(node[r]))
    if len(roots) == 1:
        tree = node[roots[0]]
    else:
        problems.append(f"{len(roots)} separate trees (missing pairs?)")
        tree = [node[r] for r in roots]
    mism = 0
    if n > 1:
        L = lca_size_matrix(tree, n)
        mism = int((L[pairs[:, 0], pairs[:, 1]] != sizes).sum())
    return {"tree": tree, "consistent": not problems and mism == 0, "problems": problems, "lca_mismatch": mism}


def leaves(node) -> list[int]:
    return [node] if isinstance(node, int) else [x for c in node for x in leaves(c)]


def lca_size_matrix(tree, n: int) -> np.ndarray:
    L = np.zeros((n, n), dtype=np.int64)

    def walk(nd) -> list[int]:
        if isinstance(nd, int):
            return [nd]
        parts = [walk(c) for c in nd]
        allv = [x for p in parts for x in p]
        for a in range(len(parts)):
            for b in range(a + 1, len(parts)):
                ia, ib = np.array(parts[a]), np.array(parts[b])
                L[np.ix_(ia, ib)] = len(allv)
                L[np.ix_(ib, ia)] = len(allv)
        return allv

    walk(tree)
    return L


def eval_tree(tree, rows: np.ndarray) -> np.ndarray:
    """Sum each row in float32 along the tree (nodes with more than two children: left to right)."""
    rows = np.asarray(rows, dtype=np.float32)

    def ev(nd):
        if isinstance(nd, int):
            return rows[:, nd]
        acc = ev(nd[0])
        for c in nd[1:]:
            acc = (acc + ev(c)).astype(np.float32)
        return acc

    with np.errstate(over="ignore", invalid="ignore"):
        return ev(tree)


def depth(tree) -> int:
    return 0 if isinstance(tree, int) else 1 + max(depth(c) for c in tree)


def is_binary(tree) -> bool:
    return isinstance(tree, int) or (len(tree) == 2 and all(is_binary(c) for c in tree))


def tree_str(tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    return "(" + "+".join(tree_str(c) for c in tree) + ")"


def root_splits(tree, levels: int = 4) -> list:
    """Leaf counts of the children, level by level from the root (a quick picture of the shape)."""
    out = []
    frontier = [tree]
    for _ in range(levels):
        nxt, row = [], []
        for nd in frontier:
            if isinstance(nd, int):
                continue
            row.append([len(leaves(c)) for c in nd])
            nxt += [c for c in nd if not isinstance(c, int)]
        if not row:
            break
        out.append(row)
        frontier = nxt
    return out


def chains(tree) -> list[list[int]]:
    """Maximal left-deep sequential runs (each step adds one leaf): [[leaves...], ...] sorted. A thread folding
    its own registers one by one shows up as one run."""
    runs: list[list[int]] = []

    def walk(nd):
        if isinstance(nd, int):
            return
        run: list[int] = []
        cur = nd
        while isinstance(cur, list) and len(cur) == 2:
            a, b = cur
            if isinstance(a, int) and isinstance(b, int):
                run += [a, b]
                cur = None
            elif isinstance(b, int):
                run.append(b)
                cur = a
            elif isinstance(a, int):
                run.append(a)
                cur = b
            else:
                break
        if len(run) >= 2:
            runs.append(sorted(run))
        if isinstance(cur, list):
            for c in cur:
                walk(c)

    walk(tree)
    return sorted(runs)


def describe(tree) -> dict:
    return {
        "depth": depth(tree),
        "binary": is_binary(tree),
        "root_splits": root_splits(tree),
        "sequential_runs": chains(tree),
        "tree_str": tree_str(tree),
    }


# example trees (tests, fakes) -----------------------------------------------------------------------------
def sequential_tree(leaf_list: list[int]):
    t = leaf_list[0]
    for x in leaf_list[1:]:
        t = [t, x]
    return t


def pairwise_tree(leaf_list: list[int]):
    if len(leaf_list) == 1:
        return leaf_list[0]
    h = len(leaf_list) // 2
    return [pairwise_tree(leaf_list[:h]), pairwise_tree(leaf_list[h:])]


def thread_butterfly_tree(n: int, per_thread: int):
    """Each of n // per_thread threads folds its elements (positions t*per_thread ... sequentially), then the
    thread results are combined by a butterfly (xor 1, 2, 4, ...): the shape of a warp-shuffle reduction."""
    threads = [sequential_tree(list(range(t * per_thread, (t + 1) * per_thread))) for t in range(n // per_thread)]
    while len(threads) > 1:
        threads = [[threads[2 * i], threads[2 * i + 1]] for i in range(len(threads) // 2)]
    return threads[0]


def canonical(tree):
    """Children sorted by smallest leaf, recursively (the form infer_tree returns)."""
    if isinstance(tree, int):
        return tree
    ch = [canonical(c) for c in tree]
    ch.sort(key=_min_leaf)
    return ch
