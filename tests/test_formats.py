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
