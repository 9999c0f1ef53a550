"""The service's settings, read from the environment (pydantic-settings).

Every variable, its default and meaning: docs/control-plane.md ("Every setting"); the `PTCTL_MAX_*` bounds are
`service.limits.Limits`. Secrets (`PTCTL_API_TOKENS`) are `SecretStr`: they never appear in a repr, a log line or
a response; their format is checked by `tokens()` (not by a validator, whose error would echo the raw value).
This module imports only pydantic, so the CLI client loads it without Ray, MLflow or torch.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.limits import Limits
from workers.paths import data_dir

Scope = Literal["read", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "admin")


class Settings(BaseSettings):
    """Everything the API process needs; `Settings()` reads the environment."""

    model_config = SettingsConfigDict(env_prefix="PTCTL_", extra="ignore", frozen=True)

    data_dir: Path = Field(default_factory=data_dir)
    database_url: str | None = Field(None, description="SQLAlchemy URL; None: SQLite in the data dir")
    api_tokens: SecretStr | None = Field(None, description="admin:TOKEN,read:TOKEN (comma-separated)")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    allow_anonymous: bool = False
    max_body_bytes: int = Field(1_000_000, gt=0)
    ray_num_cpus: int | None = Field(None, gt=0)
    ray_host: str = Field("127.0.0.1", description="the embedded Ray head's address: 127.0.0.1 (this machine "
                          "only) or one of this machine's IP addresses (other machines may join)")
    door_memory_mb: int = Field(2048, gt=0, description="what the model check of POST /studies and /plans may "
                                "allocate (its child process's cap beyond its imports; workers/door.py)")
    door_timeout_s: float = Field(60.0, gt=0, description="how long one model check may run before it is killed")
    reconcile_s: float = Field(10.0, gt=0)
    ray_lost_s: float = Field(60.0, gt=0, description="a Ray cluster unreachable this long is lost")
    limits: Limits = Field(default_factory=Limits, description="PTCTL_MAX_*: see service/limits.py")
    ray_address: str | None = Field(None, validation_alias=AliasChoices("RAY_ADDRESS", "PTCTL_RAY_ADDRESS"))
    mlflow_tracking_uri: str | None = Field(
        None, validation_alias=AliasChoices("MLFLOW_TRACKING_URI", "PTCTL_MLFLOW_TRACKING_URI"))
    mlflow_ui: str | None = Field(None, description="the MLflow UI's http(s) URL for a store that is no server "
                                  "(workers.mlflow_tracker.ui_address reads it); None: http://127.0.0.1:5000, "
                                  "`mlflow ui`'s")
    # what a remote spec may name (service/policy.py); the local CLI is not bound by these
    data_roots: Annotated[list[Path] | None, NoDecode] = Field(
        None, description="directories remote specs may read; None: the data directory (corpora/ included)")
    allow_hf_hub: bool = False
    tracking_uris: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="tracking URIs remote specs may choose besides the service's own")
    families: Annotated[list[str] | None, NoDecode] = Field(
        None, description="the model families remote specs may name; None: every registered one (plugins included)")
    storage: str | None = Field(None, description="Tune's storage for every study (resources.storage): a path every "
                                "Ray node mounts or an S3 URI; a remote spec may name only this one")

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        """`/a:/b` or `/a,/b`; empty: the default."""
        if not isinstance(value, str):
            return value
        roots = [p.strip() for p in value.replace(os.pathsep, ",").split(",") if p.strip()]
        return roots or None

    @field_validator("data_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path] | None) -> list[Path] | None:
        return None if value is None else [p.expanduser().absolute() for p in value]

    @field_validator("tracking_uris", mode="before")
    @classmethod
    def _split_uris(cls, value: object) -> object:
        """`uri1,uri2` (commas only: ':' is part of a URI)."""
        return [u.strip() for u in value.split(",") if u.strip()] if isinstance(value, str) else value

    @field_validator("families", mode="before")
    @classmethod
    def _split_families(cls, value: object) -> object:
        """`pt,bert`; empty: every family."""
        if not isinstance(value, str):
            return value
        return [f.strip() for f in value.split(",") if f.strip()] or None

    @field_validator("ray_address", "mlflow_tracking_uri", "mlflow_ui", "database_url", "api_tokens", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("mlflow_ui")
    @classmethod
    def _http_ui(cls, value: str | None) -> str | None:
        if value is not None and not value.strip().lower().startswith(("http://", "https://")):
            raise ValueError(f"PTCTL_MLFLOW_UI={value!r} is not an http(s) URL: set it to the address a browser opens "
                             "the MLflow UI at, e.g. http://127.0.0.1:5000 (`mlflow ui --backend-store-uri <store>`)")
        return value

    @field_validator("ray_host")
    @classmethod
    def _ray_ip(cls, value: str) -> str:
        """An IP address Ray can announce; any loopback name is 127.0.0.1, the one Ray binds to loopback alone."""
        if _is_loopback(value.strip()):
            return "127.0.0.1"
        try:
            address = ipaddress.ip_address(value.strip())
        except ValueError:
            address = None
        if address is None or address.is_unspecified:
            raise ValueError(f"PTCTL_RAY_HOST={value!r} is not an IP address of this machine: leave it unset "
                             "(127.0.0.1) or give the address other machines reach this one at, e.g. 10.0.0.5")
        return str(address)

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    # ------------------------------------------------------------------ derived
    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'ptctl.db'}"

    @property
    def tracking_uri(self) -> str:
        """The MLflow target of every study (also handed to the driver actors)."""
        return self.mlflow_tracking_uri or f"sqlite:///{self.data_dir / 'mlflow.db'}"

    def tokens(self) -> dict[str, Scope]:
        """token → scope; empty when no tokens are configured (then nothing is checked)."""
        return parse_tokens(self.api_tokens.get_secret_value()) if self.api_tokens else {}

    def secrets(self) -> list[str]:
        """Every secret value the logs must never show."""
        return list(self.tokens())

    def check_exposure(self) -> None:
        """Refuse to serve anonymously on a non-loopback address (anyone there could start studies)."""
        if self.tokens() or self.allow_anonymous or _is_loopback(self.host):
            return
        raise ValueError(f"PTCTL_HOST={self.host} is reachable from other machines but PTCTL_API_TOKENS is empty: "
                         "set PTCTL_API_TOKENS=admin:<secret>,read:<secret> (or PTCTL_ALLOW_ANONYMOUS=true)")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_tokens(text: str) -> dict[str, Scope]:
    """`admin:TOKEN1,read:TOKEN2` → {TOKEN1: "admin", TOKEN2: "read"}; a bad entry names the fix (never the token)."""
    tokens: dict[str, Scope] = {}
    for i, item in enumerate(p.strip() for p in text.split(",")):
        scope, sep, token = item.partition(":")
        if not sep or scope not in SCOPES or len(token) < 8:
            raise ValueError(f"PTCTL_API_TOKENS entry {i + 1}: expected SCOPE:TOKEN with SCOPE in {list(SCOPES)} "
                             "and a token of at least 8 characters, e.g. admin:$(openssl rand -hex 16)")
        tokens[token] = scope
    return tokens
