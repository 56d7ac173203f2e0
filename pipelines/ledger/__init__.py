"""The deployment ledger: every load, unload and config update mlreg sends to a replica, as an
append-only, hash-chained log kept beside the repository in its store (issue 49, item 3).

- :mod:`pipelines.ledger.events`: one event, its canonical bytes and hash, the strict reading back;
- :mod:`pipelines.ledger.chain`: where it lives, appending by conditional create, verifying;
- :mod:`pipelines.ledger.receipts`: a load's in-toto / SLSA verification-summary receipt (DSSE);
- :mod:`pipelines.ledger.query`: what served where, when;
- :mod:`pipelines.ledger.recorder`: what the ``Fleet`` is given to append its calls.
"""

from pipelines.ledger.chain import LEDGER, Finding, Ledger, ledger_of, verify_chain
from pipelines.ledger.events import Event
from pipelines.ledger.recorder import Recorder

__all__ = ["LEDGER", "Event", "Finding", "Ledger", "Recorder", "ledger_of", "verify_chain"]
