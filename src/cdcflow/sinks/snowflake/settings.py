"""Snowflake connection settings, read only from environment variables or secret files.

Variables (``<NAME>_FILE`` variants read the value from a file, e.g. a mounted secret):

* ``SNOWFLAKE_ACCOUNT`` — account identifier; when unset (and ``snowflake.emulator`` is
  ``auto``) the fakesnow emulator is used.
* ``SNOWFLAKE_USER``, ``SNOWFLAKE_ROLE``, ``SNOWFLAKE_WAREHOUSE``.
* ``SNOWFLAKE_DATABASE``, ``SNOWFLAKE_SCHEMA`` — override ``snowflake.database``/``schema``.
* ``SNOWFLAKE_PASSWORD`` (or ``SNOWFLAKE_PASSWORD_FILE``) — password authentication.
* ``SNOWFLAKE_PRIVATE_KEY_FILE`` (PEM, PKCS#8) and optional ``SNOWFLAKE_PRIVATE_KEY_PASSPHRASE``
  (or ``..._PASSPHRASE_FILE``) — key-pair authentication (wins over a password).
* ``SNOWFLAKE_HOST``, ``SNOWFLAKE_PORT``, ``SNOWFLAKE_PROTOCOL`` — optional endpoint override
  (e.g. an externally started ``fakesnow -s`` server).

Secrets are held as :class:`pydantic.SecretStr` and never logged or printed; ``repr`` of the
settings masks them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from cdcflow.errors import ConfigError


def _read(env: Mapping[str, str], name: str) -> str | None:
    """Value of ``name`` or the content of the file named by ``name_FILE`` (stripped)."""
    value = env.get(name)
    if value:
        return value
    file = env.get(f"{name}_FILE")
    if file:
        try:
            return Path(file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE: cannot read secret file ({exc.strerror})") from None
    return None


@dataclass(frozen=True)
class SnowflakeCredentials:
    """Connection settings of a real Snowflake account (secrets masked in ``repr``).

    Attributes:
        account / user / role / warehouse: Snowflake identifiers (role/warehouse optional).
        password: password authentication (None with key-pair).
        private_key_pem: PEM text of the private key (key-pair authentication).
        private_key_passphrase: passphrase of an encrypted private key.
        database / schema: overrides of the configured database and schema.
        host / port / protocol: optional endpoint override.
    """

    account: str
    user: str
    role: str | None = None
    warehouse: str | None = None
    password: SecretStr | None = None
    private_key_pem: SecretStr | None = None
    private_key_passphrase: SecretStr | None = None
    database: str | None = None
    schema: str | None = None
    host: str | None = None
    port: int | None = None
    protocol: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SnowflakeCredentials | None:
        """Read the settings; None when ``SNOWFLAKE_ACCOUNT`` is not set.

        Raises:
            ConfigError: the account is set but the user or any authentication is missing, or
                a secret file cannot be read.
        """
        env = os.environ if env is None else env
        account = _read(env, "SNOWFLAKE_ACCOUNT")
        if not account:
            return None
        user = _read(env, "SNOWFLAKE_USER")
        if not user:
            raise ConfigError("SNOWFLAKE_USER is not set (SNOWFLAKE_ACCOUNT is)")
        password = _read(env, "SNOWFLAKE_PASSWORD")
        key_file = env.get("SNOWFLAKE_PRIVATE_KEY_FILE")
        key_pem: str | None = None
        if key_file:
            try:
                key_pem = Path(key_file).read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(
                    f"SNOWFLAKE_PRIVATE_KEY_FILE: cannot read key file ({exc.strerror})"
                ) from None
        if not password and not key_pem:
            raise ConfigError(
                "Snowflake authentication missing: set SNOWFLAKE_PASSWORD(_FILE) or "
                "SNOWFLAKE_PRIVATE_KEY_FILE"
            )
        passphrase = _read(env, "SNOWFLAKE_PRIVATE_KEY_PASSPHRASE")
        port = env.get("SNOWFLAKE_PORT")
        return cls(
            account=account,
            user=user,
            role=_read(env, "SNOWFLAKE_ROLE"),
            warehouse=_read(env, "SNOWFLAKE_WAREHOUSE"),
            password=SecretStr(password) if password else None,
            private_key_pem=SecretStr(key_pem) if key_pem else None,
            private_key_passphrase=SecretStr(passphrase) if passphrase else None,
            database=_read(env, "SNOWFLAKE_DATABASE"),
            schema=_read(env, "SNOWFLAKE_SCHEMA"),
            host=env.get("SNOWFLAKE_HOST") or None,
            port=int(port) if port else None,
            protocol=env.get("SNOWFLAKE_PROTOCOL") or None,
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``snowflake.connector.connect`` (secrets revealed here only)."""
        kwargs: dict[str, Any] = {"account": self.account, "user": self.user}
        for name in ("role", "warehouse", "host", "port", "protocol"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if self.private_key_pem is not None:
            kwargs["private_key"] = _der_private_key(
                self.private_key_pem.get_secret_value(),
                self.private_key_passphrase.get_secret_value()
                if self.private_key_passphrase
                else None,
            )
        elif self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        return kwargs


def _der_private_key(pem: str, passphrase: str | None) -> bytes:
    """DER (PKCS#8) bytes of a PEM private key, as the connector's ``private_key`` expects.

    Raises:
        ConfigError: the key cannot be loaded (wrong passphrase or format); the key itself is
            never part of the message.
    """
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(
            pem.encode(), password=passphrase.encode() if passphrase else None
        )
    except (ValueError, TypeError):
        raise ConfigError(
            "SNOWFLAKE_PRIVATE_KEY_FILE: cannot load the private key (format or passphrase)"
        ) from None
    return key.private_bytes(
        encoding=serialization.Encoding.DER,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
