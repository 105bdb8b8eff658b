"""TLS, mutual TLS and HTTP/2 through real clients, against the poolserve binary it starts.

A CA made here signs the server's certificate and a client's; a second CA signs a client the
server must refuse. Checked: HTTPS over HTTP/1.1 and HTTP/2 (ALPN), gRPC over TLS with the
client certificate, HTTP/2 in the clear (h2c, prior knowledge) on a plain server, and the
refusals: no client certificate, a certificate of another CA, plain HTTP to the TLS port.

    python tests/protocols/tls_check.py POOLSERVE_BINARY MODEL_DIR
"""

import datetime
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import grpc
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpc_check import pb, rpc  # noqa: E402  (stubs compiled from proto/tei.proto)


def name(common):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def certificate(subject, key, issuer, issuer_key, *, ca=False, server=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write(folder, stem, cert, key):
    with open(f"{folder}/{stem}.pem", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(f"{folder}/{stem}.key", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def pki(folder):
    """ca.pem; server.pem/.key (localhost); client.pem/.key (by the CA); stranger.pem/.key (by another CA)."""
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("poolserve test CA", ca_key, "poolserve test CA", ca_key, ca=True)
    write(folder, "ca", ca, ca_key)
    for stem, issuer, issuer_key, server in [("server", "poolserve test CA", ca_key, True), ("client", "poolserve test CA", ca_key, False), ("stranger", "another CA", other_key, False)]:
        key = ec.generate_private_key(ec.SECP256R1())
        write(folder, stem, certificate(stem, key, issuer, issuer_key, server=server), key)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, model, flags):
    port = free_port()
    log = open(f"target/tls-check-{port}.log", "w")
    process = subprocess.Popen([binary, "serve", model, "--host", "127.0.0.1", "--port", str(port), *flags], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if process.poll() is not None:
            raise SystemExit(f"the server stopped: see target/tls-check-{port}.log")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def wait_ready(client, url):
    for _ in range(600):
        try:
            if client.get(url).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} never answered 200")


def refused(call):
    try:
        call()
    except (ssl.SSLError, httpx.HTTPError, ConnectionError, OSError) as e:
        return e
    raise AssertionError("the connection was accepted")


def main(binary, model):
    os.makedirs("target", exist_ok=True)
    folder = tempfile.mkdtemp(prefix="poolserve-pki-")
    pki(folder)
    p = lambda stem: f"{folder}/{stem}"  # noqa: E731
    tls = ["--ssl-keyfile", p("server.key"), "--ssl-certfile", p("server.pem"), "--ssl-ca-certs", p("ca.pem"), "--ssl-cert-reqs", "2"]
    servers = []
    try:
        process, port = serve(binary, model, tls)
        servers.append(process)
        base = f"https://localhost:{port}"
        client = httpx.Client(verify=ssl.create_default_context(cafile=p("ca.pem")), cert=(p("client.pem"), p("client.key")), http2=True)
        wait_ready(client, f"{base}/health")

        # HTTP/2 by ALPN, and HTTP/1.1 for a client that offers only that.
        answer = client.post(f"{base}/v1/embeddings", json={"input": "a man is eating food"})
        assert answer.status_code == 200 and answer.http_version == "HTTP/2", (answer.status_code, answer.http_version)
        h1 = httpx.Client(verify=ssl.create_default_context(cafile=p("ca.pem")), cert=(p("client.pem"), p("client.key")))
        answer_h1 = h1.post(f"{base}/v1/embeddings", json={"input": "a man is eating food"})
        assert answer_h1.http_version == "HTTP/1.1" and answer_h1.json()["data"] == answer.json()["data"]

        # gRPC over TLS with the client's certificate.
        credentials = grpc.ssl_channel_credentials(open(p("ca.pem"), "rb").read(), open(p("client.key"), "rb").read(), open(p("client.pem"), "rb").read())
        with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
            vector = rpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="a man is eating food")).embeddings
            assert [round(x, 5) for x in vector] == [round(x, 5) for x in answer.json()["data"][0]["embedding"]]

        # Refused: no client certificate, a stranger's, plain HTTP, a server nobody vouches for.
        anonymous = httpx.Client(verify=ssl.create_default_context(cafile=p("ca.pem")))
        refused(lambda: anonymous.get(f"{base}/health"))
        stranger = httpx.Client(verify=ssl.create_default_context(cafile=p("ca.pem")), cert=(p("stranger.pem"), p("stranger.key")))
        refused(lambda: stranger.get(f"{base}/health"))
        refused(lambda: httpx.get(f"http://localhost:{port}/health", timeout=5))
        refused(lambda: httpx.get(f"{base}/health"))  # the system's CAs do not know ours
        # The server still serves after the refusals.
        assert client.get(f"{base}/health").status_code == 200

        # CERT_OPTIONAL: anonymous clients come in, strangers still do not.
        process, port = serve(binary, model, tls[:-1] + ["1"])
        servers.append(process)
        base = f"https://localhost:{port}"
        wait_ready(anonymous, f"{base}/health")
        refused(lambda: stranger.get(f"{base}/health"))
        assert client.get(f"{base}/health").status_code == 200

        # Plain server: HTTP/2 in the clear with prior knowledge (h2c), as gRPC speaks it.
        process, port = serve(binary, model, [])
        servers.append(process)
        h2c = httpx.Client(http1=False, http2=True)
        wait_ready(h2c, f"http://127.0.0.1:{port}/health")
        answer = h2c.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"input": "a man is eating food"})
        assert answer.status_code == 200 and answer.http_version == "HTTP/2"
    finally:
        for process in servers:
            process.terminate()
        for process in servers:
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                raise SystemExit("a server did not stop within 40 s of SIGTERM")
    print("tls, mutual tls, http/2: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
