"""SIGKILL in the middle of a stream of writes: the restarted registry is whole.

Four writers push certificates, promote their kernels and re-report the
target's environment (drift: stale marks and suspensions) against a real
``kcert serve``. The server is killed with SIGKILL while they write, started
again on the same database, and killed once more; after each restart every
acknowledged write is there, nothing is half-written (each certificate has
its leaf and subjects, each leaf its row) and the log verifies, consistent
with the checkpoint served before the kill.
"""

from __future__ import annotations

import threading
import time

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from registry_state import Acknowledged, check_consistent
from reliability_server import RegistryServer, trust

from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate

WRITERS = 4
PER_WRITER = 40
DRIVERS = ("590.1", "590.2")


def write_stream(server: RegistryServer, certs: list[MadeCertificate], acked: Acknowledged,
                 lock: threading.Lock) -> None:  # fmt: skip
    """Push, promote and report until the server goes away or the work is done."""
    with server.client() as c:
        for i, cert in enumerate(certs):
            try:
                r = c.post("/v1/certificates", json=cert.envelope.to_json())
                if r.status_code in (200, 201):
                    with lock:
                        acked.certificates.add(r.json()["id"])
                r = c.post("/v1/promotions", json={"kernel": cert.kernel, "target": "prod"})
                with lock:
                    if r.status_code == 201:
                        acked.promotions.append((cert.kernel, "prod", r.json()["log_index"]))
                    elif r.status_code == 409:
                        acked.denials.append(r.json()["log_index"])
                if i % 5 == 4:
                    env = gpu_environment(driver_version=DRIVERS[(i // 5) % 2])
                    r = c.put("/v1/targets/prod", json={"hw_class": "H100", "environment": env})
                    if r.status_code in (200, 201):
                        with lock:
                            acked.reports.append(("prod", r.json()["generation"]))
            except httpx.TransportError:
                return  # the server was killed under us: what was acknowledged must stay


def crash_round(server: RegistryServer, certs: list[MadeCertificate], acked: Acknowledged,
                kill_after: int) -> str:  # fmt: skip
    """Write from several threads, SIGKILL the server mid-stream; return the last checkpoint."""
    lock = threading.Lock()
    chunks = [certs[i::WRITERS] for i in range(WRITERS)]
    threads = [threading.Thread(target=write_stream, args=(server, chunk, acked, lock))
               for chunk in chunks]  # fmt: skip
    start = len(acked.certificates)
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acked.certificates) - start < kill_after and time.monotonic() < deadline:
        time.sleep(0.01)
    checkpoint = httpx.get(f"{server.url}/v1/log/checkpoint", timeout=30).text
    server.kill()
    for t in threads:
        t.join(timeout=120)
    assert len(acked.certificates) - start >= kill_after, "the writers made too little progress"
    return checkpoint


def test_sigkill_during_writes_leaves_whole_state(
    server: RegistryServer, signing_key: Ed25519PrivateKey
) -> None:
    trust(server, signing_key)
    with server.client() as c:
        env = gpu_environment(driver_version=DRIVERS[0])
        assert c.put("/v1/targets/prod", json={"hw_class": "H100", "environment": env}).is_success
    certs = [
        make_certificate(signing_key, environment=gpu_environment(driver_version=DRIVERS[i % 2]))
        for i in range(2 * WRITERS * PER_WRITER)
    ]
    acked = Acknowledged()
    previous: list[tuple[str, str]] = []
    for round_, batch in enumerate((certs[: len(certs) // 2], certs[len(certs) // 2 :])):
        before = len(acked.certificates)
        note = crash_round(server, batch, acked, kill_after=25)
        # The kill must have cut the stream short, or this tested nothing.
        assert len(acked.certificates) - before < len(batch)
        server.start()
        previous.append((f"checkpoint before kill {round_ + 1}", note))
        check_consistent(server, acked, previous)
