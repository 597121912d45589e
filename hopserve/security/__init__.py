"""Who may call what, and over which channels: tokens and scopes, rate limits, TLS.

* :mod:`.tokens`: bearer tokens, scopes and the token file (re-read on change);
* :mod:`.ratelimit`: per-client token buckets;
* :mod:`.gate`: the per-call check that :func:`hopserve.rpc.add_service` runs first;
* :mod:`.tls`: server and channel credentials from PEM files (certificates re-read on
  change, so a rotation needs no restart);
* :mod:`.pki`: a development CA and certificates (``hopserve security init``).

Imports grpc (and pyyaml / cryptography lazily, where needed); never torch.
"""
