"""The company's identity provider (OpenID Connect): its discovery document, its keys, the
authorization code flow (``oidc``) and its JWTs as bearers (``bearer``)."""
