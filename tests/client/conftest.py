"""The client tests reuse the integration servers (a simulator and the gateway)."""

from tests.integration.conftest import gateway, key, sim  # noqa: F401 - pytest fixtures
