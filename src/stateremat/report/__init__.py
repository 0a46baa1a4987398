"""Tables (markdown/CSV) and figures (matplotlib) recomputed from raw records.

Reporter modules register themselves on import (one import line each below).
"""
from ._registry import REPORTERS as REPORTERS, register_reporter as register_reporter, tables_in as tables_in
from . import _cohort  # noqa: F401,E402  (registers the cohort reporters, issue 9)
from . import _semantics  # noqa: F401,E402  (registers the semantics reporters, issue 8)
from . import _bench  # noqa: F401,E402  (registers the bench reporter, issue 5)
from . import _moco  # noqa: F401,E402  (registers the moco reporter, issue 6)
