"""The lab's secrets and the router's certificate: generated once on the lab host, kept outside git (0600), and
given to Ansible in the lab inventory as a real cluster's vault would give them."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import ssl
import subprocess
import urllib.request

# Where the lab keeps what it generates (outside git).
STATE = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "lab"

# Two tenants, so the lab can show that one cannot read the other's cache.
TENANTS = ("lab-a", "lab-b")
_PASSWORDS = (
    "kv_store_lmcache_password",
    "kv_store_admin_password",
    "vllm_lmcache_api_key",
    "router_cache_salt_secret",
    "router_stats_password",
    *(f"tenant_key_{name}" for name in TENANTS),
)


def passwords(state: pathlib.Path) -> dict:
    """Every lab password by name; a name missing from the saved file (a lab made by an older kvtier) is added."""
    path = state / "secrets.json"
    values = json.loads(path.read_text()) if path.exists() else {}
    missing = [name for name in _PASSWORDS if name not in values]
    if missing:
        state.mkdir(parents=True, exist_ok=True)
        values.update({name: secrets.token_urlsafe(24) for name in missing})
        path.write_text(json.dumps(values))
        os.chmod(path, 0o600)
    return values


def certificate(state: pathlib.Path, address: str) -> tuple:
    """(certificate, key) files of a self-signed certificate for the router at `address`, made once: the lab's
    stand-in for the operator's certificate. Clients trust the certificate file itself."""
    cert, key = state / "router.crt", state / "router.key"
    if not (cert.exists() and key.exists()):
        state.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            + ["-keyout", str(key), "-out", str(cert), "-days", "825", "-subj", "/CN=kvtier lab router"]
            + ["-addext", f"subjectAltName=IP:{address}"],
            check=True,
            capture_output=True,
        )
        os.chmod(key, 0o600)
    return cert, key


def router_context(state: pathlib.Path = STATE) -> ssl.SSLContext:
    """A TLS client context that trusts the lab router's certificate, as well as the system's CAs."""
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=str(state / "router.crt"))
    return context


def trust_router(state: pathlib.Path = STATE) -> None:
    """Let this process's HTTPS clients (urllib) trust the lab router's certificate, as well as the system's CAs."""
    urllib.request.install_opener(
        urllib.request.build_opener(urllib.request.HTTPSHandler(context=router_context(state)))
    )


def files(state: pathlib.Path) -> tuple:
    """Every file this module keeps: `lab down` removes them with the lab they belong to."""
    return (state / "secrets.json", state / "router.crt", state / "router.key")


def inventory_vars(state: pathlib.Path, router_address: str) -> dict:
    """The variables the lab inventory carries for them (a real cluster's vault and group_vars)."""
    values = passwords(state)
    cert, key = certificate(state, router_address)
    tenant_keys = {f"tenant_key_{name}" for name in TENANTS}
    return {
        **{name: value for name, value in values.items() if name not in tenant_keys},
        "router_tenants": [{"name": name, "api_key": values[f"tenant_key_{name}"]} for name in TENANTS],
        "router_tls_certificate_file": str(cert),
        "router_tls_key_file": str(key),
    }
