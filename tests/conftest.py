import os
import tempfile

# One kernel cache for the whole session: expressions repeat across tests, and a cold
# compile is the expensive part of the suite.
os.environ.setdefault("SCORCH_CACHE_DIR", os.path.join(tempfile.gettempdir(), "scorch-test-cache"))
