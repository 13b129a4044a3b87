import os
import tempfile

# torch.optim's step imports torch._dynamo, which re-binds torch.manual_seed (a wrapper);
# scorch's drop-in surface is a snapshot taken at import, so import it first: otherwise
# test_dropin sees a stale scorch.manual_seed after any optimizer test has run.
import torch._dynamo  # noqa: E402,F401

# One kernel cache for the whole session: expressions repeat across tests, and a cold
# compile is the expensive part of the suite.
os.environ.setdefault("SCORCH_CACHE_DIR", os.path.join(tempfile.gettempdir(), "scorch-test-cache"))


import warnings  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def no_dense_fallback(monkeypatch):
    """The op tests' guard (``pytestmark = pytest.mark.usefixtures("no_dense_fallback")``):
    every op there has a sparse path, so the dense fallback's warning is an error, warned
    afresh (the fallback warns once per op and process)."""
    from scorch import _dispatch
    monkeypatch.setattr(_dispatch, "_warned", set())
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse kernel.*")
        yield
