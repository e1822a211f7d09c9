"""TLS: the listeners' certificates and the backend's trust, from PEM files."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BackendTls",
    "ListenerTls",
    "TlsFileError",
    "channel_credentials",
    "check",
    "client_context",
    "server_context",
    "server_credentials",
]


class TlsFileError(ValueError):
    """A TLS setting is wrong: ``key`` names it (``tls_key``), the message says why."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class ListenerTls:
    """The listeners' certificate chain and key; ``client_ca``: require client certificates."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True, slots=True)
class BackendTls:
    """Trust for an https:// or grpcs:// backend: ``ca`` (None: the system's), and the client
    certificate presented to it (``cert``/``key``, or neither)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


def _refuse_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's password.
    raise _Encrypted


class _Encrypted(Exception):
    pass


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsFileError(key, f"cannot read {path}: {exc.strerror or exc}") from None


def _pem(key: str, path: str, what: str, markers: tuple[bytes, ...]) -> bytes:
    data = _read(key, path)
    if not any(m in data for m in markers):
        raise TlsFileError(key, f"{path} holds no PEM {what}")
    return data


_CERT = (b"-----BEGIN CERTIFICATE-----",)
_KEY = (b"PRIVATE KEY-----",)


def _load_pair(ctx: ssl.SSLContext, cert: str, key: str, names: tuple[str, str]) -> None:
    """Load ``cert``/``key`` into ``ctx``; errors name ``names`` (the cert's, the key's setting)."""
    _pem(names[0], cert, "certificate", _CERT)
    if b"ENCRYPTED" in _pem(names[1], key, "private key", _KEY):
        raise TlsFileError(names[1], f"{key} is encrypted: give a key without a passphrase")
    try:
        ctx.load_cert_chain(cert, key, password=_refuse_password)
    except _Encrypted:
        raise TlsFileError(
            names[1], f"{key} is encrypted: give a key without a passphrase"
        ) from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TlsFileError(
                names[1], f"the key in {key} does not match the certificate in {cert}"
            ) from None
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
        except ssl.SSLError:
            raise TlsFileError(names[0], f"{cert} holds no valid certificate: {exc}") from None
        raise TlsFileError(names[1], f"{key} holds no valid private key: {exc}") from None
    except OSError as exc:  # the file went away between the two reads
        raise TlsFileError(names[0], f"cannot read {cert} or {key}: {exc}") from None


def _load_cas(ctx: ssl.SSLContext, path: str, name: str) -> None:
    _pem(name, path, "certificate", _CERT)
    try:
        ctx.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise TlsFileError(name, f"{path} is no valid CA bundle: {exc}") from None


def server_context(tls: ListenerTls) -> ssl.SSLContext:
    """The REST listener's context (raises :class:`TlsFileError`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    _load_pair(ctx, tls.cert, tls.key, ("tls_cert", "tls_key"))
    if tls.client_ca is not None:
        _load_cas(ctx, tls.client_ca, "tls_client_ca")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(tls: BackendTls) -> ssl.SSLContext:
    """An https:// backend's context: verification and host-name check on."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    if tls.ca is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_cas(ctx, tls.ca, "backend_ca")
    if tls.cert is not None and tls.key is not None:
        _load_pair(ctx, tls.cert, tls.key, ("backend_cert", "backend_key"))
    return ctx


def server_credentials(tls: ListenerTls) -> Any:
    """The gRPC listener's ``grpc.ServerCredentials`` (files checked by :func:`check`)."""
    import grpc

    ca = _read("tls_client_ca", tls.client_ca) if tls.client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(_read("tls_key", tls.key), _read("tls_cert", tls.cert))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def channel_credentials(tls: BackendTls) -> Any:
    """A grpcs:// backend's ``grpc.ChannelCredentials`` (None for ``ca``: gRPC's own roots)."""
    import grpc

    pair: tuple[bytes | None, bytes | None] = (None, None)
    if tls.cert is not None and tls.key is not None:
        pair = (_read("backend_key", tls.key), _read("backend_cert", tls.cert))
    return grpc.ssl_channel_credentials(
        root_certificates=_read("backend_ca", tls.ca) if tls.ca is not None else None,
        private_key=pair[0],
        certificate_chain=pair[1],
    )


def _together(values: dict[str, Any], a: str, b: str) -> None:
    if (values.get(a) is None) != (values.get(b) is None):
        given, missing = (a, b) if values.get(a) is not None else (b, a)
        raise TlsFileError(given, f"'{given}' needs '{missing}' too")


def check(values: dict[str, Any], backend_tls: bool) -> tuple[ListenerTls | None, BackendTls]:
    """Validate the TLS settings in ``values`` (absent or None: not set); ``backend_tls``: whether
    the backend is https:// or grpcs://. Returns the listeners' and the backend's TLS."""
    _together(values, "tls_cert", "tls_key")
    _together(values, "backend_cert", "backend_key")
    if values.get("tls_client_ca") is not None and values.get("tls_cert") is None:
        raise TlsFileError("tls_client_ca", "'tls_client_ca' needs 'tls_cert' and 'tls_key'")
    if not backend_tls:
        for key in ("backend_ca", "backend_cert"):
            if values.get(key) is not None:
                raise TlsFileError(key, f"'{key}' needs an https:// or grpcs:// backend")
    listener = None
    if values.get("tls_cert") is not None:
        listener = ListenerTls(values["tls_cert"], values["tls_key"], values.get("tls_client_ca"))
        server_context(listener)
    backend = BackendTls(
        values.get("backend_ca"), values.get("backend_cert"), values.get("backend_key")
    )
    if backend_tls:
        client_context(backend)
    return listener, backend
