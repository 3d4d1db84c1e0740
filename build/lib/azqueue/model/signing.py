"""HMAC-SHA256 signatures under rotating secrets: the newest key signs, every key
verifies (so a secret can be added in front and the old one dropped later)."""

from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, hmac


class Macs:
    """Signs a message with ``keys[0]`` and verifies it against every key, as unpadded
    URL-safe base64."""

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        if not keys:
            raise ValueError("at least one key is needed")
        self._keys = keys

    @staticmethod
    def _mac(key: bytes, message: bytes) -> hmac.HMAC:
        mac = hmac.HMAC(key, hashes.SHA256())
        mac.update(message)
        return mac

    def sign(self, message: bytes) -> str:
        digest = self._mac(self._keys[0], message).finalize()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def verify(self, message: bytes, signature: str) -> bool:
        """Constant-time check of ``signature`` against every key (each is tried, so the
        time does not tell which one matched)."""
        try:
            raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
        except (binascii.Error, ValueError):
            return False
        ok = False
        for key in self._keys:
            try:
                self._mac(key, message).verify(raw)
                ok = True
            except InvalidSignature:
                pass
        return ok
