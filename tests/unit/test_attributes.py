"""Binary-attribute marginals: oracles for tables, structure, consistency, estimator, accounting."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from stream_dp.attributes import BinaryDomain, JunctionTreeModel, choose_structure
from stream_dp.attributes.consistency import constraint_blocks, make_consistent
from stream_dp.attributes.dependence import (
    WEIGHT_GRID,
    bootstrap_budgets,
    cooccurrence_scale,
    cooccurrence_sensitivity,
    cooccurrence_vector,
    histogram_scale,
    measure_bootstrap,
    measure_cooccurrence,
    measure_pairs,
    pair_sensitivity,
    pair_vector,
    pairs_scale,
)
from stream_dp.attributes.release import MarginalRelease, run_offline, split_budget
from stream_dp.attributes.structure import Structure
from stream_dp.attributes.tables import cell_index, count_table, marginalize
from stream_dp.consistency import weighted_general_solution

KEY = bytes(range(32))


def _grid(m: int) -> np.ndarray:
    return np.array(list(itertools.product([0, 1], repeat=m)), dtype=np.uint8)


def _latent_data(n: int, m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.random((n, 2)) < 0.3
    which = np.arange(m) % 2
    p1 = np.where(z[:, which], 0.8, 0.05)
    bits = (rng.random((n, m)) < p1).astype(np.uint8)
    bits[:, -1] = bits[:, 0] & bits[:, 1]  # a higher-order dependence
    return bits


# ---------------------------------------------------------------- domain and tables
def test_domain_encodes_bits_and_names() -> None:
    d = BinaryDomain(["a", "b", "c", "d"])
    assert d.encode("0110").tolist() == [0, 1, 1, 0]
    assert d.encode(["d", "a"]).tolist() == [1, 0, 0, 1]
    assert d.encode_many(["1000", ["b"]]).tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]
    for bad in ("011", "01a0"):
        with pytest.raises(ValueError):
            d.encode(bad)
    with pytest.raises(ValueError, match="undeclared"):
        d.encode(["z"])
    with pytest.raises(ValueError):
        BinaryDomain.numbered(65)
    assert d.check_query([3, 0]) == (3, 0)
    for q in ([0, 0], [4], [], list(range(9))):
        with pytest.raises(ValueError):
            BinaryDomain.numbered(12).check_query(q) if len(q) == 9 else d.check_query(q)


def test_cell_order_first_attribute_most_significant() -> None:
    grid = _grid(4)
    for q in [(0,), (2, 0), (3, 1, 2), (1, 3, 0, 2)]:
        idx = cell_index(grid, q)
        brute = [sum(int(row[a]) << (len(q) - 1 - i) for i, a in enumerate(q)) for row in grid]
        assert idx.tolist() == brute


def test_marginalize_matches_counting() -> None:
    bits = _latent_data(500, 5, 1)
    full = count_table(bits, (0, 1, 2, 3, 4))
    for keep in [(4,), (3, 0), (2, 4, 1), (4, 3, 2, 1, 0)]:
        assert np.array_equal(marginalize(full, (0, 1, 2, 3, 4), keep), count_table(bits, keep))


# ---------------------------------------------------------------- structure
def test_structure_is_a_capped_chow_liu_forest() -> None:
    rng = np.random.default_rng(3)
    for trial in range(30):
        m = int(rng.integers(2, 12))
        x = rng.normal(size=(m, m))
        excess = (x + x.T) / 2
        cap = int(rng.integers(1, 5))
        s = choose_structure(excess, max_cluster=cap)
        assert sorted(a for c in s.clusters for a in c) == list(range(m))
        assert all(len(c) <= cap for c in s.clusters)
        covered = {a for t in s.tables for a in t}
        assert covered == set(range(m)), trial
        # bridges only for positive excess, and clusters + bridges form a forest (no cycles)
        assert all(excess[i, j] > 0 for i, j in s.bridges)
        parent = {c: c for c in s.clusters}
        where = {a: c for c in s.clusters for a in c}

        def find(
            c: tuple[int, ...], parent: dict[tuple[int, ...], tuple[int, ...]] = parent
        ) -> tuple[int, ...]:
            while parent[c] != c:
                c = parent[c]
            return c

        for i, j in s.bridges:
            ri, rj = find(where[i]), find(where[j])
            assert ri != rj
            parent[ri] = rj


def test_structure_finds_planted_clusters() -> None:
    m = 9
    excess = np.full((m, m), -1.0)
    for group in ([0, 3, 6], [1, 4, 7], [2, 5, 8]):
        for i, j in itertools.combinations(group, 2):
            excess[i, j] = excess[j, i] = 1.0
    excess[0, 1] = excess[1, 0] = 0.5
    s = choose_structure(excess, max_cluster=3)
    assert set(s.clusters) == {(0, 3, 6), (1, 4, 7), (2, 5, 8)}
    assert s.bridges == ((0, 1),)


# ---------------------------------------------------------------- consistency
def _dense_constraints(tables: list[tuple[int, ...]]) -> np.ndarray:
    sizes = [1 << len(t) for t in tables]
    offs = np.concatenate([[0], np.cumsum(sizes)])
    rows = []
    for x, y in itertools.combinations(range(len(tables)), 2):
        common = sorted(set(tables[x]) & set(tables[y]))
        for sub in [[], *[[a] for a in common], common]:
            for v in range(1 << len(sub)):
                r = np.zeros(offs[-1])
                for t, sign in ((x, 1.0), (y, -1.0)):
                    k = len(tables[t])
                    g = _grid(k)
                    cells = cell_index(g, [tables[t].index(a) for a in sub]) == v
                    r[offs[t] : offs[t + 1]] += sign * cells
                rows.append(r)
    return np.array(rows)


def test_consistency_equals_the_dense_gls_oracle() -> None:
    rng = np.random.default_rng(7)
    tables = [(0, 1, 2), (2, 3), (3, 4, 5), (5,), (1, 6)]
    values = [rng.uniform(0, 100, 1 << len(t)) for t in tables]
    variances = [1.0, 4.0, 2.0, 0.5, 3.0]
    got = np.concatenate(make_consistent(tables, values, variances, tol=1e-12, max_iter=20000))
    M = _dense_constraints(tables)
    var = np.concatenate([np.full(1 << len(t), v) for t, v in zip(tables, variances, strict=True)])
    want = weighted_general_solution(M, np.zeros(M.shape[0]), np.concatenate(values), var)
    assert np.allclose(got, want, atol=1e-6), np.abs(got - want).max()
    assert np.abs(M @ got).max() < 1e-6


def test_constraint_blocks_cover_shared_attributes() -> None:
    blocks, offsets = constraint_blocks([(0, 1), (1, 2), (1, 3), (4,)])
    assert offsets.tolist() == [0, 4, 8, 12, 14]
    assert len(blocks) == 2  # attribute 1 shared by three tables; the totals
    assert blocks[0].matrix.shape == (4, 12)


# ---------------------------------------------------------------- estimator
def _maxent_brute(m: int, tables: list[tuple[int, ...]], values: list[np.ndarray]) -> np.ndarray:
    """Iterative proportional fitting over all 2**m cells: the maximum-entropy distribution."""
    grid = _grid(m)
    probs = np.full(1 << m, 1.0 / (1 << m))
    idx = [cell_index(grid, t) for t in tables]
    for _ in range(500):
        for i, v in zip(idx, values, strict=True):
            cur = np.bincount(i, weights=probs, minlength=v.size)
            probs *= (v / v.sum())[i] / np.where(cur[i] > 0, cur[i], 1.0)
    return probs


@pytest.mark.parametrize("seed", range(4))
def test_junction_tree_equals_brute_force_max_entropy(seed: int) -> None:
    m = 7
    rng = np.random.default_rng(seed)
    bits = _latent_data(4000, m, seed)
    x = rng.normal(size=(m, m))
    structure = choose_structure((x + x.T) / 2, max_cluster=3)
    tables = list(structure.tables)
    values = [count_table(bits, t) + 0.5 for t in tables]  # exact (consistent) tables
    values = make_consistent(tables, values, tol=1e-13, max_iter=20000)
    model = JunctionTreeModel(tables, values)
    probs = _maxent_brute(m, tables, values)
    grid = _grid(m)
    for q in [(0,), (6, 2), (1, 3, 5), (4, 0, 6, 2), tuple(range(m)), (5, 1, 2, 0, 3)]:
        want = np.bincount(cell_index(grid, q), weights=probs, minlength=1 << len(q))
        got = model.probabilities(q)
        assert np.allclose(got, want, atol=1e-6), (q, structure, got, want)
    # the consistent tables share one total, between the smallest and largest pseudo-counted one
    totals = [float(v.sum()) for v in values]
    assert max(totals) - min(totals) < 1e-6
    assert 4000 < model.total <= 4000 + 0.5 * 2 ** max(len(t) for t in tables)


def test_estimator_is_a_distribution_even_for_inconsistent_negative_tables() -> None:
    tables = [(0, 1), (1, 2), (3,)]
    values = [np.array([5.0, -2.0, 3.0, 7.0]), np.array([1.0, 0.0, 0.0, 9.0]), np.array([0.0, 0.0])]
    model = JunctionTreeModel(tables, values)
    for q in [(0, 2), (3,), (2, 3, 0, 1)]:
        p = model.probabilities(q)
        assert np.all(p >= 0) and math.isclose(p.sum(), 1.0)


def test_stderr_only_inside_one_table() -> None:
    model = JunctionTreeModel([(0, 1, 2), (2, 3)], [np.ones(8), np.full(4, 2.0)], [4.0, 9.0])
    assert model.stderr((0, 1)) == pytest.approx(math.sqrt(2 * 4.0))
    assert model.stderr((2,)) == pytest.approx(math.sqrt(4 * 4.0))  # min over tables
    assert model.stderr((0, 3)) is None


# ---------------------------------------------------------------- accounting
def _run_vectors(bits: np.ndarray, ticks: np.ndarray, tables: list[tuple[int, ...]]) -> np.ndarray:
    """Exact per-tick count vector over every cell of every table, shape (T, cells)."""
    rel = MarginalRelease(tables, 0.9, 8, 1.0, KEY, "acct")
    out = np.zeros((int(ticks.max()), rel.n_cells))
    ids = rel.cell_ids(bits)
    for t in range(1, out.shape[0] + 1):
        out[t - 1] = np.bincount(ids[ticks == t].reshape(-1), minlength=rel.n_cells)
    return out


@pytest.mark.parametrize(("m", "max_ones"), [(5, 4), (12, 4), (12, None), (8, None)])
def test_accounting_from_first_principles(m: int, max_ones: int | None) -> None:
    """Remove (or add) one event: every measured quantity's L1 change, budgets summed."""
    from stream_dp.attributes.dependence import ones_histogram

    rng = np.random.default_rng(m)
    n, T, eps = 60, 6, 1.0
    bits = (rng.random((n, m)) < 0.35).astype(np.uint8)
    bits[0] = 1  # a heavy event: more than K ones
    ticks = rng.integers(1, T + 1, n)
    ticks[-1] = T
    res = run_offline(
        bits, ticks, epsilon=eps, p=0.9, key=KEY, description="acct", max_ones=max_ones
    )
    split, tables, sketch = res.split, list(res.structure.tables), res.sketch
    assert sketch is not None and sketch.epsilon == split.bootstrap
    mech = res.release.bank.mechanism
    assert mech.cap == 1.0 and mech.privacy.epsilon == split.per_table  # type: ignore[attr-defined]
    k = sketch.max_ones
    if sketch.method == "cooc":
        assert k is not None and cooccurrence_sensitivity(k) < pair_sensitivity(m)
        boot, boot_args, want = cooccurrence_vector, (k,), cooccurrence_sensitivity(k)
    else:
        assert k is None
        boot, boot_args, want = pair_vector, (), pair_sensitivity(m)  # type: ignore[assignment]
    assert split.bootstrap_sensitivity == sketch.sensitivity == want
    if max_ones is None:
        assert sketch.histogram_epsilon > 0
    eps_h, eps_boot = bootstrap_budgets(split.bootstrap, max_ones is None)  # as measured
    assert eps_h == sketch.histogram_epsilon
    full_b = boot(bits, *boot_args)
    full_h = ones_histogram(bits)
    full_t = _run_vectors(bits, ticks, tables)
    extra = np.ones((1, m), dtype=np.uint8)
    neighbours = [(np.delete(bits, i, 0), np.delete(ticks, i)) for i in range(n)]
    neighbours.append((np.vstack([bits, extra]), np.append(ticks, 3)))
    # exact ε per unit change at the scales the samplers really receive (Fraction: no slack)
    if sketch.method == "cooc":
        per_boot = 1 / (Fraction(WEIGHT_GRID) * Fraction(cooccurrence_scale(k, eps_boot)))
    else:
        per_boot = 1 / Fraction(pairs_scale(m, eps_boot))
    per_hist = 1 / Fraction(histogram_scale(sketch.histogram_epsilon)) if max_ones is None \
        else Fraction(0)
    if mech.name == "naive-int":
        per_cell = Fraction(mech.cap) / Fraction(mech.scale_units)  # type: ignore[attr-defined]
        assert per_cell <= Fraction(split.per_table)
    else:
        per_cell = Fraction(split.per_table)
    worst = Fraction(0)
    for nb_bits, nb_ticks in neighbours:
        d_boot = float(np.abs(boot(nb_bits, *boot_args) - full_b).sum())
        assert d_boot <= want + 1e-12
        d_hist = float(np.abs(ones_histogram(nb_bits)[: m + 1] - full_h).sum())
        assert d_hist == 1.0
        vec = _run_vectors(nb_bits, nb_ticks, tables)
        rows = min(vec.shape[0], full_t.shape[0])
        diff = np.abs(vec[:rows] - full_t[:rows])
        # only the event's own tick changes, and there one cell of each table by exactly 1
        changed = np.nonzero(diff.sum(axis=1))[0]
        assert changed.size == 1
        per_table = np.add.reduceat(diff[changed[0]], res.release.offsets[:-1])
        assert per_table.tolist() == [1.0] * len(tables)
        loss = per_hist * Fraction(d_hist)  # histogram: scale ≥ 1/ε_h
        loss += per_boot * Fraction(d_boot)  # bootstrap: scale ≥ Δ₀/(ε₀ − ε_h)
        loss += per_cell * Fraction(float(diff.sum()))  # tables: ≤ ε_t per unit change
        worst = max(worst, loss)
    assert worst <= Fraction(eps)
    assert split.spent_exact <= Fraction(eps)


def test_max_ones_follows_the_histogram() -> None:
    from stream_dp.attributes.dependence import choose_max_ones

    m = 32
    sparse = np.zeros(m + 1)
    sparse[:6] = [100, 400, 300, 150, 40, 10]
    assert choose_max_ones(sparse, m) == 3  # 50 of 1000 events (≤ 10 %) above 3 ones
    dense = np.zeros(m + 1)
    dense[20:33] = 100
    assert choose_max_ones(dense, m) is None  # K = 31: 1 + K + C(K,2) > ⅔ C(32,2)
    dense64 = np.zeros(65)
    dense64[20:33] = 100
    assert choose_max_ones(dense64, 64) == 31


def test_split_budget_never_exceeds_epsilon() -> None:
    for eps, k, b in [(1.0, 7, 0.2), (0.3, 13, 0.1), (1e-3, 3, 1e-4), (2.0, 1, 0.0)]:
        s = split_budget(eps, k, b, 37.0, "cooc")
        assert s.spent_exact == Fraction(b) + k * Fraction(s.per_table) <= Fraction(eps)
        assert s.spent <= eps and s.per_table > 0
        assert s.spent == pytest.approx(eps, rel=1e-12)


def test_cooccurrence_weights_are_bounded_and_on_the_grid() -> None:
    rng = np.random.default_rng(0)
    bits = (rng.random((300, 20)) < 0.5).astype(np.uint8)
    v = cooccurrence_vector(bits, 6)
    assert np.all(v / WEIGHT_GRID == np.round(v / WEIGHT_GRID))
    for i in range(30):
        d = np.abs(cooccurrence_vector(np.delete(bits, i, 0), 6) - v).sum()
        assert d <= cooccurrence_sensitivity(6)


# ---------------------------------------------------------------- noise: statistical, fixed keys
def test_bootstrap_noise_scale_matches_its_variance() -> None:
    bits = np.zeros((10, 40), dtype=np.uint8)
    sk = measure_cooccurrence(bits, 0.5, KEY, "noise-test", max_ones=4)
    # n11 cells are pure noise here; variance σ² with σ² = noise_variance / 2.25
    emp = float(np.var(sk.tables[:, 3]))
    assert 0.8 < emp / (sk.noise_variance / 2.25) < 1.25
    pk = measure_pairs(bits[:, :12], 0.5, KEY, "noise-test")
    emp = float(np.var(pk.tables - pair_vector(bits[:, :12]).reshape(-1, 4)))
    assert 0.7 < emp / pk.noise_variance < 1.4
    # another description: other noise
    other = measure_cooccurrence(bits, 0.5, KEY, "noise-test-2", max_ones=4)
    assert not np.array_equal(other.tables, sk.tables)
    assert measure_bootstrap(bits, 0.5, KEY, "x", max_ones=8).method == "cooc"
    assert measure_bootstrap(bits[:, :6], 0.5, KEY, "x", max_ones=8).method == "pairs"
    sparse = np.zeros((20000, 40), dtype=np.uint8)
    sparse[np.arange(20000), np.arange(20000) % 40] = 1
    sparse[::2, 7] = 1
    auto = measure_bootstrap(sparse, 0.5, KEY, "x")
    assert (auto.method, auto.max_ones, auto.histogram_epsilon) == ("cooc", 2, 0.025)
    dense = np.ones((20000, 40), dtype=np.uint8)
    assert measure_bootstrap(dense, 0.5, KEY, "x").method == "pairs"


def test_answers_are_unbiased_within_the_stderr() -> None:
    """A query inside one table: error / stderr-bound over many key seeds is ~N(0, ≤1)."""
    bits = _latent_data(3000, 6, 5)
    ticks = np.repeat(np.arange(1, 11), 300)
    z = []
    for seed in range(40):
        key = seed.to_bytes(2, "little") * 16
        res = run_offline(
            bits, ticks, epsilon=2.0, p=0.8, key=key, description="stat", max_cluster=6
        )
        (table,) = res.structure.tables
        w = 0.8 ** (10 - ticks).astype(np.float64)
        exact = count_table(bits, (0, 1), w)
        se = res.model.stderr((0, 1))
        assert se is not None
        assert table == tuple(range(6))
        z.append((res.model.answer((0, 1))[0] - exact[0]) / se)
    z_arr = np.array(z)
    assert abs(z_arr.mean()) < 0.6 and 0.3 < z_arr.std() < 1.5


def test_structure_from_explicit_tables() -> None:
    s = Structure.from_tables(4, [(2, 0), (1, 3)])
    assert s.tables == ((0, 2), (1, 3))


# ---------------------------------------------------------------- query helper
def test_query_helper_names_cells_and_errors() -> None:
    from stream_dp.attributes import answer, answer_all

    d = BinaryDomain(["x", "y", "z"])
    model = JunctionTreeModel(
        [(0, 1), (1, 2)], [np.array([4.0, 2, 2, 2]), np.array([3.0, 3, 1, 3])]
    )
    a = answer(model, ["z", 0], d)
    assert a.attributes == (2, 0) and a.names == ("z", "x")
    assert a.cell({"z": 1, "x": 0}) == pytest.approx(a.counts[2])
    assert a.as_dict()["stderr_bound"] is None
    assert len(answer_all(model, [[0], [1, 2]])) == 2
    for bad in (["x", "x"], ["w"], [5]):
        with pytest.raises(ValueError):
            answer(model, bad, d)
    with pytest.raises(ValueError):
        answer(model, ["x"])


def test_bridge_tables_extend_into_clusters_and_stay_decomposable() -> None:
    m = 8
    excess = np.full((m, m), -1.0)
    for group in ([0, 1, 2], [3, 4, 5], [6, 7]):
        for i, j in itertools.combinations(group, 2):
            excess[i, j] = excess[j, i] = 2.0
    excess[2, 3] = excess[3, 2] = 1.0
    excess[5, 6] = excess[6, 5] = 0.9
    excess[1, 3] = excess[3, 1] = 0.5
    s = choose_structure(excess, max_cluster=3, bridge_size=4)
    assert s.bridges == ((2, 3), (5, 6))
    assert s.bridge_tables is not None
    # each side keeps at most |cluster| - 1 attributes: never a whole cluster
    assert s.bridge_tables[0] in {(0, 2, 3, 4), (1, 2, 3, 4), (0, 2, 3, 5), (1, 2, 3, 5)}
    assert set(s.bridge_tables[1]) >= {5, 6} and 7 not in s.bridge_tables[1]
    assert choose_structure(excess, max_cluster=3, bridge_size=2).bridge_tables == ((2, 3), (5, 6))


def test_auto_bridge_size_grows_with_the_data() -> None:
    from stream_dp.attributes.release import auto_bridge_size, decayed_total_estimate

    sizes = [auto_bridge_size(n, 0.04, 0.99, 6) for n in (1e3, 3e4, 1e5, 1e6, 1e8)]
    assert sizes == sorted(sizes) and sizes[0] == 2 and sizes[-1] == 6
    assert decayed_total_estimate(30000, 300, 0.99) == pytest.approx(100 * (1 - 0.99**300) / 0.01)
    assert decayed_total_estimate(500, 7, 1.0) == 500


def test_binary_domain_file(tmp_path: Path) -> None:
    ok = tmp_path / "d.toml"
    ok.write_text('[domain]\nkind = "binary"\nattributes = ["a", "b", "c"]\n')
    assert BinaryDomain.from_file(ok).names == ("a", "b", "c")
    example = Path(__file__).resolve().parents[2] / "examples" / "domain-binary.toml"
    assert BinaryDomain.from_file(example).m == 8
    for text in ('kind = "grid"\nattributes = ["a"]\n', 'kind = "binary"\n', "kind = [\n"):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=r"bad\.toml"):
            BinaryDomain.from_file(bad)
    with pytest.raises(ValueError, match="cannot read"):
        BinaryDomain.from_file(tmp_path / "missing.toml")


def test_normsub_is_the_simplex_projection() -> None:
    from scipy.optimize import minimize

    from stream_dp.attributes.model import _nonnegative

    rng = np.random.default_rng(11)
    for _ in range(5):
        v = rng.normal(2.0, 5.0, 8)
        v[0] = 40.0
        got = _nonnegative(v, "normsub")
        assert np.all(got >= 0) and got.sum() == pytest.approx(v.sum())
        total = float(v.sum())
        cons = [{"type": "eq", "fun": lambda x, t=total: x.sum() - t}]
        opt = minimize(
            lambda x, v=v: ((x - v) ** 2).sum(),
            np.full(8, total / 8),
            bounds=[(0, None)] * 8,
            constraints=cons,
            method="SLSQP",
            options={"ftol": 1e-12},
        )
        assert np.allclose(got, opt.x, atol=1e-3)
        assert ((got - v) ** 2).sum() <= ((opt.x - v) ** 2).sum() + 1e-9
    ok = np.array([3.0, 0.0, 1.0])
    assert np.array_equal(_nonnegative(ok, "normsub"), ok)
    assert np.array_equal(_nonnegative(np.array([-1.0, 2.0]), "clip"), [0.0, 2.0])
