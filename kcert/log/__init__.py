"""The audit log as a library: no database, no web framework.

- :mod:`kcert.log.merkle`: RFC 6962 hashing over stored perfect subtrees, and
  the RFC 9162 inclusion and consistency proofs assembled from them.
- :mod:`kcert.log.proofs`: the RFC 9162 verification algorithms.
- :mod:`kcert.log.note`: C2SP signed notes, tlog checkpoints, verifier keys and
  the log's Ed25519 key file.
- :mod:`kcert.log.leaf`: the bytes of a leaf and the checks an auditor makes.
- :mod:`kcert.log.monitor`: auditing a log with nothing but its public key.
- re-deciding logged decisions lives in :mod:`kcert.registry.replay`, beside the policy.
- :mod:`kcert.log.source`: reading a log over HTTP.

The registry stores the tree (:mod:`kcert.registry.audit`); the API serves it
(:mod:`kcert.api.routes_log`); ``kcert audit`` audits it.
"""
