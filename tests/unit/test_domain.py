"""Domain model: constructors, validation, event routing, constraint matrices, domain files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stream_dp.domain import Domain


def test_flat() -> None:
    d = Domain.flat(["a", "b"])
    assert d.names == ("a", "b") and d.kind == "flat" and d.touches == 1
    np.testing.assert_array_equal(d.nodes_for_event("b"), [1])
    assert d.constraint_matrix().shape == (0, 2)
    with pytest.raises(KeyError, match="undeclared"):
        d.nodes_for_event("c")


def test_from_paths_adds_internal_nodes_in_bfs_order() -> None:
    d = Domain.from_paths(["eu/fr/paris", "eu/fr/lyon", "eu/de", "us"])
    assert d.names == ("all", "eu", "us", "eu/fr", "eu/de", "eu/fr/paris", "eu/fr/lyon")
    assert d.parent is not None
    assert d.parent.tolist() == [-1, 0, 0, 1, 1, 3, 3]
    assert d.touches == 4
    assert [d.names[i] for i in d.nodes_for_event("eu/fr/lyon")] == [
        "eu/fr/lyon",
        "eu/fr",
        "eu",
        "all",
    ]
    assert [d.names[i] for i in d.nodes_for_event("us")] == ["us", "all"]
    with pytest.raises(KeyError, match="internal"):
        d.nodes_for_event("eu")
    with pytest.raises(KeyError):
        d.nodes_for_event("eu/it")
    forest = Domain.from_paths(["a.x", "b"], sep=".", root=None)
    assert forest.names == ("a", "b", "a.x") and forest.touches == 2
    # truth from leaves satisfies M x = 0
    x = np.zeros(len(d))
    for i, leaf in enumerate(["eu/fr/paris", "eu/fr/lyon", "eu/de", "us"]):
        x[d.nodes_for_event(leaf)] += i + 1
    assert np.all(d.constraint_matrix() @ x == 0)
    assert d.n_constraints == 3


@pytest.mark.parametrize(
    "paths,match",
    [
        ([], "empty"),
        (["a", "a"], "duplicate"),
        (["a//b"], "empty component"),
        (["all/x"], "root"),
        ([""], "non-empty"),
    ],
)
def test_from_paths_validation(paths: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Domain.from_paths(paths)


def test_from_parent_validation() -> None:
    d = Domain.from_parent(["r", "a", "b"], [-1, 0, 0])
    assert d.touches == 2
    with pytest.raises(ValueError, match="cycle"):
        Domain.from_parent(["r", "a", "b"], [-1, 2, 1])
    with pytest.raises(ValueError, match="not a node index"):
        Domain.from_parent(["r", "a"], [-1, 7])
    with pytest.raises(ValueError, match="duplicate"):
        Domain.from_parent(["r", "r"], [-1, 0])
    with pytest.raises(ValueError, match="empty"):
        Domain.from_parent([], [])
    with pytest.raises(ValueError, match="one entry per name"):
        Domain.from_parent(["r", "a"], [-1])


def test_grid_names_and_events() -> None:
    d = Domain.grid({"region": ["n", "s"], "product": ["a", "b", "c"]})
    assert d.names[:6] == ("total", "region=n", "region=s", "product=a", "product=b", "product=c")
    assert d.names[6:] == tuple(f"region={r}|product={p}" for r in "ns" for p in "abc")
    assert d.touches == 4 and d.cell_shape == (2, 3)
    nodes = d.nodes_for_event("product=b|region=s")
    assert [d.names[i] for i in nodes] == ["total", "region=s", "product=b", "region=s|product=b"]
    np.testing.assert_array_equal(nodes, d.nodes_for_event("region=s|product=b"))
    for bad in [
        "region=s",
        "region=x|product=a",
        "color=r|region=s|product=a",
        "region=s|region=n",
        "junk",
    ]:
        with pytest.raises(KeyError):
            d.nodes_for_event(bad)
    # truth from events satisfies the grid constraints
    rng = np.random.default_rng(0)
    x = np.zeros(len(d))
    for _ in range(50):
        x[
            d.nodes_for_event(f"region={rng.choice(['n', 's'])}|product={rng.choice(list('abc'))}")
        ] += 1
    assert np.all(d.constraint_matrix() @ x == 0)
    assert d.n_constraints == 1 + 2 + 3


@pytest.mark.parametrize(
    "attrs,match",
    [
        ({}, "at least one"),
        ({"a": ["x", "y"]}, "at least 2"),
        ({"a": ["x", "x"], "b": ["y"]}, "duplicate"),
        ({"a=": ["x"], "b": ["y"]}, "attribute name"),
        ({"a": ["x|y"], "b": ["y"]}, "must not contain"),
        ({"a": [], "b": ["y"]}, "empty"),
        ({"a": "xy", "b": ["y"]}, "list"),
    ],
)
def test_grid_validation(attrs: dict[str, list[str]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Domain.grid(attrs)


def test_constraint_groups() -> None:
    d = Domain.flat(["a1", "b1", "a2", "b2"]).with_constraints(
        "pairs", [[1, -1]], [["a1", "b1"], ["a2", "b2"]]
    )
    M = d.constraint_matrix().toarray()
    np.testing.assert_array_equal(M, [[1, -1, 0, 0], [0, 0, 1, -1]])
    with pytest.raises(ValueError, match="disjoint"):
        Domain.flat(["a", "b", "c"]).with_constraints("g", [[1, -1]], [["a", "b"], ["b", "c"]])
    with pytest.raises(ValueError, match="shape"):
        Domain.flat(["a", "b", "c"]).with_constraints("g", [[1, -1]], [["a", "b", "c"]])
    with pytest.raises(KeyError):
        Domain.flat(["a", "b"]).with_constraints("g", [[1, -1]], [["a", "zz"]])


def test_from_toml_and_file(tmp_path: Path) -> None:
    assert Domain.from_toml({"kind": "flat", "streams": ["x", "y"]}).names == ("x", "y")
    h = Domain.from_toml(
        {"kind": "hierarchy", "paths": ["a/b", "a/c"], "root": "top", "name": "shops"}
    )
    assert h.names == ("top", "a", "a/b", "a/c") and h.name == "shops"
    p = Domain.from_toml(
        {"kind": "hierarchy", "streams": ["r", "x", "y"], "parents": ["", "r", "r"]}
    )
    assert p.parent is not None and p.parent.tolist() == [-1, 0, 0]
    f = tmp_path / "domain.toml"
    f.write_text(
        '[domain]\nkind = "grid"\n[domain.attributes]\nsize = ["s", "l"]\ncolor = ["r", "g"]\n'
        '[[domain.constraints]]\nname = "eq"\nmatrix = [[1, -1]]\nrows = [["size=s", "size=l"]]\n'
    )
    g = Domain.from_file(f)
    assert g.kind == "grid" and g.names[1:5] == ("size=s", "size=l", "color=r", "color=g")
    assert len(g.groups) == 1 and g.n_constraints == 1 + 2 + 2 + 1
    for bad, match in [
        ({"kind": "tree"}, "kind"),
        ({"kind": "flat", "streams": "x"}, "list of strings"),
        ({"kind": "flat", "streams": ["x"], "color": 1}, "unknown"),
        ({"kind": "hierarchy", "streams": ["r", "x"], "parents": ["", "q"]}, "unknown parent"),
        ({"kind": "grid", "attributes": ["a"]}, "table"),
    ]:
        with pytest.raises(ValueError, match=match):
            Domain.from_toml(bad)


def test_immutable() -> None:
    d = Domain.from_paths(["a/b"])
    with pytest.raises(AttributeError):
        d.names = ("x",)  # type: ignore[misc]
    assert d.parent is not None
    with pytest.raises(ValueError):
        d.parent[0] = 3


def test_large_paths_domain() -> None:
    paths = [f"r{i % 100}/s{i % 1000}/k{i}" for i in range(100_000)]
    d = Domain.from_paths(paths)
    assert len(d) == 1 + 100 + 1000 + 100_000 and d.touches == 4
    x = np.ones(len(d))
    res_values = d.constraint_matrix() @ x
    assert res_values.shape == (1 + 100 + 1000,)


def test_positions_is_the_domains_index_read_only() -> None:
    d = Domain.from_paths(["eu/fr", "eu/de", "us"])
    assert dict(d.positions) == {n: i for i, n in enumerate(d.names)}
    assert all(d.positions[n] == d.index(n) for n in d.names)
    with pytest.raises(TypeError):
        d.positions["x"] = 9  # type: ignore[index]
