"""The rule for dataset-version keys, free of Dagster so that storage, pods and the CLI share it."""

from __future__ import annotations

import re

# A version key becomes a path segment under the storage root and a Kubernetes label value,
# so it must be safe for both: no separators, no traversal, no whitespace, at most 63 characters.
_VERSION_KEY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class InvalidVersionKey(ValueError):
    """A dataset-version key that cannot be used as a partition."""


def validate_version_key(key: str) -> str:
    """Return ``key`` unchanged if it is a safe dataset-version key, else raise with the rule."""
    if not isinstance(key, str) or not _VERSION_KEY.fullmatch(key) or ".." in key:
        raise InvalidVersionKey(
            f"invalid dataset version key {key!r}: use 1-63 characters from [A-Za-z0-9._-], "
            "starting and ending with a letter or digit, with no '..', spaces or slashes"
        )
    return key
