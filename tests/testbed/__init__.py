"""The SSH testbed: network-namespace hosts with real sshd (see README.md)."""

from tests.testbed.bed import Host, Testbed, TestbedError, missing_tools

__all__ = ["Host", "Testbed", "TestbedError", "missing_tools"]
