"""The MLflow tracking URI an export is given: checked in one line before anything is sent, its credentials
(``http://user:pass@host``) taken out of everything that is printed, kept or keyed and handed to MLflow's client the
way it reads them (MLFLOW_TRACKING_USERNAME/PASSWORD), and the server's health asked first."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import HpctrainError

HTTP = ("http", "https")
EXAMPLE = "http://HOST:PORT or sqlite:///PATH"


@dataclass(frozen=True)
class TrackingUri:
    """A tracking URI: ``shown`` has no credentials (messages, the ledger's key); ``client`` is what MLflow's client
    gets (a database URI keeps its own, which only its driver reads)."""

    shown: str
    client: str
    username: str | None = None
    password: str | None = None

    @property
    def key(self) -> str:
        """What the ledger and the export lock know this tracker by."""
        return f"mlflow:{self.shown}"

    def redact(self, text: str) -> str:
        """``text`` with the URI's credentials taken out."""
        text = text.replace(self.client, self.shown)
        return text.replace(self.password, "***") if self.password else text

    def credentials(self) -> None:
        """Hand the credentials to MLflow's client (it reads them from the environment on each request)."""
        if self.username is not None:
            os.environ["MLFLOW_TRACKING_USERNAME"] = self.username
            os.environ["MLFLOW_TRACKING_PASSWORD"] = self.password or ""


def default_uri(ledger_path: Path) -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite file beside the ledger (MLflow's own default is a SQLite file too)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ledger_path.parent.resolve() / 'mlflow.db'}"


def parse(uri: str) -> TrackingUri:
    """The URI, or one line saying what is wrong with it (never its credentials)."""
    if not uri or any(c.isspace() or not c.isprintable() for c in uri):
        raise HpctrainError(f"--tracking-uri: expected a URI such as {EXAMPLE}, got an empty one or one with spaces")
    try:
        parts = urllib.parse.urlsplit(uri)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise HpctrainError(f"--tracking-uri: not a URI ({exc}); expected one such as {EXAMPLE}") from None
    if not parts.scheme or not (parts.netloc or parts.path):
        raise HpctrainError(f"--tracking-uri: expected a URI such as {EXAMPLE} (scheme://...)")
    shown = uri.replace(parts.netloc, parts.netloc.rpartition("@")[2], 1)
    if parts.scheme not in HTTP:
        return TrackingUri(shown, uri, None, parts.password and urllib.parse.unquote(parts.password))
    if not parts.hostname:
        raise HpctrainError(f"--tracking-uri {shown}: no host; expected {EXAMPLE}")
    username = None if parts.username is None else urllib.parse.unquote(parts.username)
    password = None if parts.password is None else urllib.parse.unquote(parts.password)
    return TrackingUri(shown, shown, username, password)


def reachable(uri: TrackingUri, timeout_s: float = 10.0) -> None:
    """Refuse, in one line, a tracking server that does not answer its health check (before anything is sent)."""
    if not uri.shown.startswith(tuple(f"{s}://" for s in HTTP)):
        return
    ask = urllib.request.Request(f"{uri.shown.rstrip('/')}/health")
    if uri.username is not None:
        token = base64.b64encode(f"{uri.username}:{uri.password or ''}".encode()).decode()
        ask.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(ask, timeout=timeout_s) as answer:
            answer.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = uri.redact(str(getattr(exc, "reason", exc)))
        raise HpctrainError(
            f"MLflow tracking server {uri.shown}: unreachable ({reason}); nothing was exported"
        ) from None
