import os
import tempfile

# torch.optim's step imports torch._dynamo, which re-binds torch.manual_seed (a wrapper);
# scorch's drop-in surface is a snapshot taken at import, so import it first: otherwise
# test_dropin sees a stale scorch.manual_seed after any optimizer test has run.
import torch._dynamo  # noqa: E402,F401

# One kernel cache for the whole session: expressions repeat across tests, and a cold
# compile is the expensive part of the suite.
os.environ.setdefault("SCORCH_CACHE_DIR", os.path.join(tempfile.gettempdir(), "scorch-test-cache"))
