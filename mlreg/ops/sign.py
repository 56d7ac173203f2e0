"""``mlreg sign``: sign a version registered earlier (OpenSSF model signing).

Its registered files are fetched and hashed, checked against the digest MLflow recorded, and
signed; the signature is logged beside its manifest (``registry.register.sign_registered``).
:class:`SignerSpec` is how every verb that signs (``export``, ``register``, ``sign``) names its
key: ``--sign-key`` / ``MLREG_SIGNING_KEY`` (a PEM path, or ``sigstore``), a certificate, a chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlreg.ops.context import open_registry
from registry.errors import UsageError
from registry.register import sign_registered
from registry.settings import Settings
from registry.signing import SigningKey


@dataclass(frozen=True)
class SignerSpec:
    """The signing options as given (paths or ``sigstore``; ``key`` None: no signing asked)."""

    key: str | None = None
    cert: str | None = None
    chain: str | None = None

    def signer(self) -> SigningKey | None:
        return SigningKey.of(self.key, self.cert, self.chain) if self.key else None

    def required(self) -> SigningKey:
        """The key, for a verb that cannot do without one (``mlreg sign``)."""
        signer = self.signer()
        if signer is None:
            raise UsageError(
                "mlreg sign needs a key", fix="pass --sign-key PATH (or set MLREG_SIGNING_KEY), or 'sigstore'"
            )
        return signer


@dataclass
class SignReport:
    model: str
    version: str
    signed_by: str

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "signed_by": self.signed_by}

    def line(self) -> str:
        return f"{self.model}: version {self.version} signed by {self.signed_by}"


def sign_version(settings: Settings, model: str, version: str, signer: SigningKey) -> SignReport:
    """Sign ``model`` ``version`` with ``signer`` (``SignerSpec(...).required()``)."""
    return SignReport(model, version, sign_registered(open_registry(settings), model, version, signer))


__all__ = ["SignReport", "SignerSpec", "sign_version"]
