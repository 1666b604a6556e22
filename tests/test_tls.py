"""HTTPS and mutual TLS of `python -m extender` (scheduler `enableHTTPS` + `tlsConfig`).

A CA, a server certificate for 127.0.0.1 and a client certificate are made by the ``openssl``
CLI in the test; a second, unrelated CA signs an impostor client. The service runs as a
subprocess, the way an operator starts it. Asserted: with ``--tls-cert/--tls-key`` it answers
kube-scheduler's real request over HTTPS and verifies against the CA; plain HTTP gets no answer;
with ``--tls-client-ca`` a client without a certificate, or with one from another CA, is refused
in the handshake while the right client is served; bad TLS flags end with a one-line error.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server import REPO_ROOT, run_extender

FIXTURES = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_signed(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    make_signed(
        directory,
        "server",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    make_signed(directory, "scheduler", "ca", "extendedKeyUsage=clientAuth\n")
    make_signed(directory, "impostor", "other-ca", "extendedKeyUsage=clientAuth\n")
    return directory


def request_body() -> bytes:
    return (FIXTURES / "cache-capable" / "prioritize-request.json").read_bytes()


def client_context(pki: Path, cert: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert is not None:
        context.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    return context


def tls_flags(pki: Path) -> list[str]:
    return ["--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key")]


def test_https_with_a_certificate_made_in_the_test(pki: Path) -> None:
    with run_extender(tls_flags(pki)) as service:
        assert service.url.startswith("https://127.0.0.1:")
        with httpx.Client(verify=client_context(pki, None), timeout=10) as client:
            answer = client.post(f"{service.url}/prioritize", content=request_body())
            assert answer.status_code == 200
            assert [entry["Host"] for entry in answer.json()] == ["node-a", "node-b", "node-c"]
            assert client.get(f"{service.url}/readyz").status_code == 200
        # The certificate is checked: a client trusting another CA refuses the server.
        untrusting = ssl.create_default_context(cafile=str(pki / "other-ca.crt"))
        with (
            httpx.Client(verify=untrusting, timeout=10) as client,
            pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
        ):
            client.get(f"{service.url}/healthz")
        # Plain HTTP on the HTTPS port gets no extender answer.
        plain = service.url.replace("https://", "http://")
        with httpx.Client(timeout=10) as client:
            try:
                status = client.get(f"{plain}/healthz").status_code
            except httpx.HTTPError:
                status = None
            assert status != 200
        # The log's curl line trusts the certificate.
        curl = next(json.loads(line)["curl"] for line in service.log_lines if '"try it"' in line)
        assert "--cacert" in curl and service.url in curl


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca(pki: Path) -> None:
    flags = [*tls_flags(pki), "--tls-client-ca", str(pki / "ca.crt")]
    with run_extender(flags) as service:
        with httpx.Client(verify=client_context(pki, "scheduler"), timeout=10) as client:
            answer = client.post(f"{service.url}/filter", content=request_body())
            assert answer.status_code == 200
            assert answer.json()["NodeNames"]
        for cert in (None, "impostor"):
            # TLS 1.3 reports the refusal after the handshake: on the first read or write.
            with (
                httpx.Client(verify=client_context(pki, cert), timeout=10) as client,
                pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)),
            ):
                client.post(f"{service.url}/prioritize", content=request_body())
        # Still serving the right client after the refusals.
        with httpx.Client(verify=client_context(pki, "scheduler"), timeout=10) as client:
            assert client.get(f"{service.url}/healthz").status_code == 200


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "server.crt"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.crt"], "--tls-client-ca needs --tls-cert"),
        (["--tls-cert", "missing.crt", "--tls-key", "server.key"], "cannot load --tls-cert"),
        (["--tls-cert", "server.crt", "--tls-key", "other-ca.key"], "cannot load --tls-cert"),
        (
            ["--tls-cert", "server.crt", "--tls-key", "server.key", "--tls-client-ca", "nope"],
            "cannot load --tls-client-ca",
        ),
    ],
)
def test_bad_tls_flags_end_with_a_one_line_error(pki: Path, flags: list[str], message: str) -> None:
    absolute = [flag if flag.startswith("--") else str(pki / flag) for flag in flags]
    result = subprocess.run(
        [sys.executable, "-m", "extender", "--port", "0", *absolute],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("python -m")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
