"""The admin API: Anthropic's Admin API (``/v1/organizations/…``) over the gateway's organisations
("workspaces"), keys ("api_keys"), limits and reports, plus our extensions under the same prefix
(key create and rotate, balances and top-ups, the audit trail). docs/admin-api.md.

- ``auth``: admin keys in ``x-api-key`` or ``Authorization: Bearer`` (``admin_context``);
- ``errors``: the error family, always in Anthropic's envelope;
- ``pages``: the list envelopes (``SyncPage``, cursor pages) and query helpers;
- ``service``: the one service layer under the API and the CLI (``record_change``: the audit trail);
- ``api``: the flask-smorest ``Api`` (its OpenAPI document) and the blueprints it registers;
- ``workspaces``, ``keys``, ``audit``: the endpoints.
"""
