import pickle

import pytest
from hypothesis import given, strategies as st

import scorch
from scorch.formats import Format, LevelKind, as_format


def test_named_formats():
    assert as_format("csr") == Format("dc")
    assert as_format("csc") == Format("dc", mode_order=(1, 0))
    assert as_format("dcsr") == Format("cc")
    assert as_format("dcsc") == Format("cc", (1, 0))
    assert as_format("coo", 3) == Format("qqq")
    assert as_format("csf", 3) == Format("ccc")
    assert as_format("dense", 2) == Format("dd")
    assert as_format("dcc") == Format([scorch.dense, scorch.compressed, scorch.compressed])
    assert as_format("cc") == as_format("dcsr")


@pytest.mark.parametrize("fmt,name", [
    (Format("dc"), "csr"), (Format("dc", (1, 0)), "csc"), (Format("cc"), "dcsr"),
    (Format("cc", (1, 0)), "dcsc"), (Format("qq"), "coo"), (Format("ccc"), "csf"),
    (Format("dd"), "dense"), (Format("dc", block=(2, 2)), "bsr"),
    (Format("dc", (1, 0), block=(2, 3)), "bsc"), (Format("dcq"), None),
])
def test_names_and_str(fmt, name):
    assert fmt.name == name
    assert str(fmt) == (name or repr(fmt))
    assert eval(repr(fmt), {"Format": Format}) == fmt


def test_value_semantics():
    a, b = Format("dc"), as_format("csr")
    assert a == b and hash(a) == hash(b) and a is not b
    assert Format("dc") != Format("dc", (1, 0))
    assert Format("dc", block=(2, 2)) != Format("dc")
    assert Format("dc", block=(1, 1)) == Format("dc")  # a 1x1 block is no block
    assert len({Format("dc"), as_format("csr"), as_format("csc")}) == 2
    assert pickle.loads(pickle.dumps(Format("cq", (1, 0), (2, 3)))) == Format("cq", (1, 0), (2, 3))
    assert Format("dc") == "csr" and Format("dc") != "csc" and Format("dc") != "nonsense"


def test_level_queries():
    f = Format("dc", (1, 0))
    assert f.levels == (LevelKind.DENSE, LevelKind.COMPRESSED)
    assert f.level_of_dim(1) == 0 and f.kind_of_dim(0) is scorch.compressed
    assert f.is_sparse and not Format("dd").is_sparse
    assert f.permuted((1, 0)) == Format("dc")


@pytest.mark.parametrize("bad", ["csx", "dcz", "", "bsr"])
def test_unknown_format_raises(bad):
    with pytest.raises(ValueError):
        as_format(bad, 2)


def test_rank_mismatch_raises():
    with pytest.raises(ValueError, match="levels but the tensor has 3"):
        as_format("csr", 3)
    with pytest.raises(ValueError, match="needs the tensor's rank"):
        as_format("coo")
    with pytest.raises(ValueError, match="not a permutation"):
        Format("dc", (0, 0))
    with pytest.raises(ValueError, match="block"):
        Format("dc", block=(2,))


@given(st.lists(st.sampled_from("dcq"), min_size=1, max_size=5), st.randoms())
def test_roundtrip_through_repr(letters, rnd):
    order = list(range(len(letters)))
    rnd.shuffle(order)
    f = Format("".join(letters), order)
    assert eval(repr(f), {"Format": Format}) == f
    assert as_format(f, len(letters)) is f


def test_transposed_copy_keeps_dense_levels_only_where_they_cost_nothing():
    """A copy in another mode order keeps the kinds by position (CSR as CSC), but a dense
    level under a sparse one only for a dimension of the source's dense tail: attention
    scores 'dcdd' over (i, j, b, h) stored as (b, h, j, i) must not get a dense level over i
    under the compressed j (b*h*n*n slots)."""
    from scorch import Format
    assert Format("dc").transposed_copy((1, 0)) == Format("dc", mode_order=(1, 0))   # CSC
    assert Format("dd").transposed_copy((1, 0)) == Format("dd", mode_order=(1, 0))
    scores = Format("dcdd", mode_order=(2, 3, 0, 1))
    assert scores.transposed_copy((0, 1, 3, 2)).level_string == "dccc"
    assert scores.transposed_copy((2, 0, 3, 1)).level_string == "dccd"   # h: dense tail, kept
    assert Format("cs").transposed_copy((1, 0)).level_string == "cc"     # singleton: no copy
