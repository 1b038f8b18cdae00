"""An S3-compatible server (moto) on loopback, over HTTPS with a certificate authority of its
own: the tests and the benchmark train from a bucket without any remote address."""

import datetime
import ipaddress
import multiprocessing
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A certificate authority, and a certificate for 127.0.0.1 that it signed, with its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def sign(subject: str, key: "ec.EllipticCurvePrivateKey", ca_key: object) -> bytes:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(datetime.datetime(2000, 1, 1))
            .not_valid_after(datetime.datetime(2100, 1, 1))
            .add_extension(x509.BasicConstraints(ca=key is ca_key, path_length=None), True)
        )
        if key is not ca_key:
            address = x509.IPAddress(ipaddress.ip_address(subject))
            builder = builder.add_extension(x509.SubjectAlternativeName([address]), False)
        return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(sign("test CA", ca_key, ca_key))
    paths[1].write_bytes(sign("127.0.0.1", key, ca_key))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def serve(port: int, certificate: str, key: str) -> None:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    tls = (certificate, key)
    make_server("127.0.0.1", port, app, threaded=True, ssl_context=tls).serve_forever()


@contextmanager
def s3_server(folder: Path) -> Iterator[dict[str, str]]:
    """Runs the server in a process of its own; yields the AWS variables that point at it,
    which is where a real bucket's settings come from too. Its certificate authority is
    trusted by boto3 (AWS_CA_BUNDLE) and by LitData's fast downloads (SSL_CERT_FILE)."""
    ca, certificate, key = certificates(folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    server = context.Process(target=serve, args=(port, str(certificate), str(key)), daemon=True)
    server.start()
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or not server.is_alive():
                server.kill()
                raise RuntimeError("the S3 server did not start") from None
            time.sleep(0.1)
    try:
        yield {
            "AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CA_BUNDLE": str(ca),
            "SSL_CERT_FILE": str(ca),
        }
    finally:
        server.kill()
        server.join(10)
