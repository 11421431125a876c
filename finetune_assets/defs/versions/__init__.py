"""Dataset versions: the dynamic partitions (:mod:`.partitions`), registration (:mod:`.register`),
the landing zone and its sensor (:mod:`.landing`, :mod:`.landing_sensor`, :mod:`.cursor`,
:mod:`.delta_tables`), and what ended a version's run (:mod:`.run_outcome`).

The versions feature contributes sensors only: the assets of a version are the other features'.
"""

from finetune_assets.defs.versions.landing_sensor import landing_zone_sensor
from finetune_assets.defs.versions.run_outcome import version_outcome_sensor

__all__ = ["sensors"]

sensors = [landing_zone_sensor, version_outcome_sensor]
