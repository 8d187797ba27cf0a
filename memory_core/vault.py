"""The secret vault: with LUCID_VAULT_KEY set, a secret a person asked to keep is stored encrypted
(AES-256-GCM, a fresh nonce per record) in the namespace's `.vault/` instead of being dropped."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets as _random
from typing import Any

from Crypto.Cipher import AES

from .errors import InvalidInput

_SALT = b"lucid-vault-v1"


def derive_key(passphrase: str) -> bytes:
    """A 256-bit key from the operator's passphrase (scrypt: slow to brute-force if the file leaks)."""
    if len(passphrase) < 12:
        raise InvalidInput("LUCID_VAULT_KEY must be at least 12 characters")
    return hashlib.scrypt(passphrase.encode(), salt=_SALT, n=2**14, r=8, p=1, dklen=32)


def seal(key: bytes, record: dict[str, Any]) -> str:
    """One vault line: base64(nonce | tag | ciphertext) of the JSON record."""
    nonce = _random.token_bytes(12)
    cipher = AES.new(key, AES.MODE_GCM, nonce=nonce)
    body, tag = cipher.encrypt_and_digest(json.dumps(record, ensure_ascii=False).encode())
    return base64.b64encode(nonce + tag + body).decode()


def unseal(key: bytes, line: str) -> dict[str, Any]:
    raw = base64.b64decode(line)
    cipher = AES.new(key, AES.MODE_GCM, nonce=raw[:12])
    data = cipher.decrypt_and_verify(raw[28:], raw[12:28])
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not a vault record")
    return value
