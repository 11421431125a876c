"""What ``landing_zone_sensor`` remembers between ticks: the versions it registered, files waiting
to settle, problems already reported and how far each watched Delta table was followed.
"""

import json
from dataclasses import dataclass, field

# 2: only what registration needs (1 also followed each version's runs); a cursor of 1 is read
CURSOR_VERSIONS = (1, 2)


@dataclass
class LandingCursor:
    """What the sensor remembers between ticks (JSON in the sensor cursor)."""

    registered: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {fp, sig}
    pending: dict[str, str] = field(default_factory=dict)  # file key -> signature seen last tick
    reported: dict[str, str] = field(default_factory=dict)  # entry -> problem already logged
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {seen, rows}

    @classmethod
    def parse(cls, raw: str | None) -> "LandingCursor":
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls()  # behaves like a reset cursor: existing partitions are never added again
        if data.get("v") not in CURSOR_VERSIONS:
            return cls()
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def dumps(self) -> str:
        return json.dumps(
            {"v": CURSOR_VERSIONS[-1], **{k: getattr(self, k) for k in self.__dataclass_fields__}},
            sort_keys=True,
        )
