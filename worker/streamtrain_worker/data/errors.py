"""The data layer's exception tree, in one place so callers know what each error means.

- ``DataError`` — base of every error raised while reading training data.
  - ``BadDataError`` — too many unparsable lines in a file (more than
    ``maxBadLineFraction`` of its lines); permanent: the data, not the worker, is wrong,
    so the scheduler fails the job instead of retrying (reason ``BadData``).
  - ``CorruptFileError`` — a file cannot be read at all (truncated gzip, a header that does
    not name the configured columns); names the file.
- ``LayoutError`` (also a ``ValueError``) — an invalid pass plan or day string
  (``splitIntervalMinutes`` not dividing a day, day ``20261131``); names the field.
- ``DataConfigError`` (a ``streamtrain_ps.plumbing.settings.ConfigError``) — the rendered
  ``data`` JSON is invalid; carries the field's path (``exc.path``).

The pure modules (``layout``, ``sharding``) import only this module, so the scheduler can
catch these errors without importing anything heavy.
"""

from __future__ import annotations

from streamtrain_ps.plumbing.settings import ConfigError


class DataError(Exception):
    """Base class of errors raised while reading training data."""


class BadDataError(DataError):
    """The bad-line fraction of a file exceeded ``maxBadLineFraction``."""


class CorruptFileError(DataError):
    """A data file cannot be read (truncated or corrupt gzip, mismatching header)."""


class LayoutError(ValueError):
    """An invalid day, pass index or split configuration."""


class DataConfigError(ConfigError):
    """The ``data`` section of the job is invalid; ``path`` names the field."""
