"""Fifty concurrent clients pushing and promoting against a real server lose nothing.

Each client has its own connection and its own certificates, and all of them
also push one shared certificate and promote its kernel (the same row, the
same moment). Every 2xx answer must be in the final state, every logged
index must hold the leaf the answer named, duplicates must resolve to one
row and one ``certificate.stored`` leaf, and the log must verify.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from registry_state import Acknowledged, check_consistent, leaves
from reliability_server import RegistryServer, trust

from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate

CLIENTS = 50
OWN_CERTS = 2


def test_fifty_clients_push_and_promote_without_loss(
    server: RegistryServer, signing_key: Ed25519PrivateKey
) -> None:
    trust(server, signing_key)
    env = gpu_environment()
    with server.client() as c:
        assert c.put("/v1/targets/prod", json={"hw_class": "H100", "environment": env}).is_success
    shared = make_certificate(signing_key, environment=env)
    own = [[make_certificate(signing_key, environment=env) for _ in range(OWN_CERTS)]
           for _ in range(CLIENTS)]  # fmt: skip
    acked = Acknowledged()
    created: list[tuple[str, int]] = []
    failures: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client(mine: list[MadeCertificate]) -> None:
        with server.client() as c:
            barrier.wait(timeout=60)  # all fifty start together
            for cert in [shared, *mine]:
                r = c.post("/v1/certificates", json=cert.envelope.to_json())
                with lock:
                    if r.status_code == 201:
                        created.append((r.json()["id"], r.json()["log_index"]))
                    if r.status_code in (200, 201):
                        acked.certificates.add(r.json()["id"])
                    else:
                        failures.append(f"push -> {r.status_code} {r.text[:200]}")
                r = c.post("/v1/promotions", json={"kernel": cert.kernel, "target": "prod"})
                with lock:
                    if r.status_code == 201:
                        acked.promotions.append((cert.kernel, "prod", r.json()["log_index"]))
                    else:
                        failures.append(f"promote -> {r.status_code} {r.text[:200]}")

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        for future in [pool.submit(client, mine) for mine in own]:
            future.result(timeout=300)

    assert not failures, "\n".join(failures[:10])
    wanted = {shared.id} | {c.id for mine in own for c in mine}
    assert acked.certificates == wanted
    # The shared certificate was created by exactly one push; the others found it.
    assert sorted(cid for cid, _ in created) == sorted(wanted)
    assert len(acked.promotions) == CLIENTS * (1 + OWN_CERTS)
    indices = [index for *_, index in acked.promotions] + [index for _, index in created]
    assert len(indices) == len(set(indices)), "two answers named the same log leaf"

    log = leaves(server.database_url)
    for cid, index in created:
        assert log[index]["kind"] == "certificate.stored"
        assert log[index]["payload"]["certificate"] == cid
    with server.client() as c:
        promoted = {p["kernel"] for p in c.get("/v1/promotions", params={"target": "prod"}).json()}
        assert promoted == {shared.kernel} | {c_.kernel for mine in own for c_ in mine}
        for cert in [shared, *[c_ for mine in own for c_ in mine]]:
            listed = c.get(f"/v1/kernels/{cert.kernel}/certificates").json()
            assert [x["id"] for x in listed] == [cert.id]
    check_consistent(server, acked)
