"""A namespace is (tenant, user, persona): the unit of isolation, locking and storage."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
_HASHED = re.compile(r"h-[0-9a-f]{32}\Z")  # what `safe_component` makes of an unsafe value


def _safe(value: str) -> bool:
    return bool(_SAFE.match(value)) and value not in (".", "..")


def stored_component(value: str) -> str:
    """A folder name as `str()` and `list_namespaces` give it, kept (a hashed one too); else hashed."""
    return value if _safe(value) else safe_component(value)


def safe_component(value: str) -> str:
    """`value` if it is a safe path component, else `h-` + a hash of it (stable, collision-resistant). A
    value shaped like a hash is hashed too: an id that reads `h-<hex>` cannot land in another id's folder."""
    if _safe(value) and not _HASHED.match(value):
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"h-{digest}"


@dataclass(frozen=True, order=True)
class Namespace:
    tenant: str
    user: str
    persona: str

    @classmethod
    def of(cls, tenant: str = "default", user: str = "default", persona: str = "default") -> Namespace:
        return cls(safe_component(tenant), safe_component(user), safe_component(persona))

    def path(self, data_dir: Path) -> Path:
        return data_dir / self.tenant / self.user / self.persona

    @property
    def key(self) -> str:
        """A short, stable key for Redis keys and job ids (letters, digits, `-` only)."""
        return hashlib.sha1(f"{self.tenant}/{self.user}/{self.persona}".encode()).hexdigest()[:16]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.user}/{self.persona}"

    @classmethod
    def parse(cls, text: str) -> Namespace:
        """Inverse of `str()`: `tenant/user/persona` (a part already safe, a hashed one too, is kept)."""
        parts = text.split("/")
        if len(parts) != 3:
            raise ValueError(f"a namespace is tenant/user/persona, got {text!r}")
        return cls.at(*parts)

    @classmethod
    def at(cls, tenant: str, user: str, persona: str) -> Namespace:
        """The namespace in these folders (`of` takes raw ids: it would hash a hashed name again)."""
        return cls(stored_component(tenant), stored_component(user), stored_component(persona))


def list_namespaces(data_dir: Path) -> list[Namespace]:
    """Every namespace that has a MEMORY.md or a raw archive under `data_dir`."""
    found: list[Namespace] = []
    if not data_dir.is_dir():
        return found
    for tenant in sorted(p for p in data_dir.iterdir() if p.is_dir() and _SAFE.match(p.name)):
        for user in sorted(p for p in tenant.iterdir() if p.is_dir()):
            for persona in sorted(p for p in user.iterdir() if p.is_dir()):
                if (persona / "MEMORY.md").exists() or (persona / "raw").is_dir():
                    found.append(Namespace(tenant.name, user.name, persona.name))
    return found
