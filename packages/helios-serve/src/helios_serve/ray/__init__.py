"""Helios replicas on Ray Serve (the optional `ray` extra; docs/deploy.md).

`helios-serve-ray` (cli) serves N replicas of one verified core, each a full Helios
server, behind a Ray Serve ingress with conversation-affine routing: `affinity` (the
plain routing rule), `prompt` (a request's page keys), `router` (Ray's request router),
`replica`, `ingress` and `app` (the deployments).
"""
