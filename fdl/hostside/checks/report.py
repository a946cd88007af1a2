"""The probe report: one host's check results, and its JSON form.

Host-side (fdl/hostside/): standard library only; shared by the local probe,
the Ansible probe module on every host and the cluster aggregation. The JSON schema is versioned (SCHEMA_VERSION).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 2  # 2: the GPU health and software stack checks, the report's `time`
OK, WARNING, ERROR, SKIPPED = "ok", "warning", "error", "skipped"


@dataclass
class CheckResult:
    """One check: a stable name, a status, a sentence, a hint a person can act on, and data."""

    name: str
    status: str
    message: str
    hint: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CheckResult:
        return cls(name=str(doc["name"]), status=str(doc["status"]), message=str(doc.get("message", "")),
                   hint=doc.get("hint"), data=dict(doc.get("data") or {}))


@dataclass
class HostReport:
    """Every check run on one host."""

    host: str
    checks: list[CheckResult] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    time: float | None = None  # the host's wall clock (Unix seconds) when the probe ran

    @property
    def errors(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == ERROR]

    @property
    def warnings(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def cpu_host(self) -> bool:
        """Judged as a CPU host (its devices are CPU ranks): the GPU-only checks were skipped."""
        gpu = self.check("gpu")
        return gpu is not None and gpu.status == SKIPPED and bool(gpu.data.get("cpu_host"))

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "host": self.host, "ok": self.ok, "time": self.time,
                "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> HostReport:
        when = doc.get("time")
        return cls(host=str(doc["host"]), checks=[CheckResult.from_dict(c) for c in doc.get("checks", [])],
                   schema_version=int(doc.get("schema_version", SCHEMA_VERSION)),
                   time=float(when) if isinstance(when, (int, float)) else None)

    def check(self, name: str) -> CheckResult | None:
        """The result of the check called `name`, if it ran."""
        return next((c for c in self.checks if c.name == name), None)
